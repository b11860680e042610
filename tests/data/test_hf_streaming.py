"""Hugging Face datasets streamed from local Parquet and Arrow files (data=hf data.name=parquet
or arrow): every row read in order, no Arrow cache written (nothing materialized), and files
that are not what the builder reads refused, naming them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpformer.data.corpus import CorpusSpec, read_documents

datasets = pytest.importorskip("datasets")


def _rows(n: int, start: int = 0) -> dict[str, list]:
    return {
        "text": [f"Document {i} opens. It closes {i}." for i in range(start, start + n)],
        "id": list(range(start, start + n)),
    }


def test_parquet_and_arrow_files_stream_without_an_arrow_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two Parquet files of row groups of 10, and the Arrow file of a save_to_disk()."""
    cache = tmp_path / "hf_cache"
    monkeypatch.setenv("HF_DATASETS_CACHE", str(cache))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    first, second = tmp_path / "a.parquet", tmp_path / "b.parquet"
    datasets.Dataset.from_dict(_rows(50)).to_parquet(str(first), batch_size=10)
    datasets.Dataset.from_dict(_rows(30, 50)).to_parquet(str(second), batch_size=10)
    datasets.Dataset.from_dict(_rows(20)).save_to_disk(str(tmp_path / "saved"))
    arrow = sorted((tmp_path / "saved").glob("*.arrow"))
    want = _rows(80)["text"]
    parquet = CorpusSpec(source="hf", name="parquet", paths=(str(first), str(second)))
    assert list(read_documents(parquet)) == want
    arrow_spec = CorpusSpec(source="hf", name="arrow", paths=tuple(map(str, arrow)))
    assert list(read_documents(arrow_spec)) == want[:20]
    assert not list(cache.rglob("*.arrow")), "streaming must not write an Arrow cache"


def test_streamed_files_that_do_not_match_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.parquet"
    bad.write_text("not a parquet file")
    with pytest.raises(ValueError, match=r"data\.name=parquet could not read .*bad\.parquet"):
        list(read_documents(CorpusSpec(source="hf", name="parquet", paths=(str(bad),))))
    good = tmp_path / "good.parquet"
    datasets.Dataset.from_dict(_rows(3)).to_parquet(str(good))
    spec = CorpusSpec(source="hf", name="parquet", paths=(str(good),), text_field="body")
    with pytest.raises(ValueError, match=r"no column 'body' \(columns: \['id', 'text'\]\)"):
        list(read_documents(spec))
