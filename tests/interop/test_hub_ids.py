"""Models by name (interop/hub.py): a Hugging Face Hub id given to `init=` and to
`tpformer-convert from-hf` resolves through huggingface_hub exactly as `from_pretrained` does,
tested offline (HF_HUB_OFFLINE=1) against a cache this test lays out in the hub's own format
(models--ORG--NAME/{blobs, refs/REVISION, snapshots/COMMIT/...}, files as links to their blobs);
a revision after `@` picks its snapshot; an id neither cached nor reachable is one line, exit 2,
before any process starts."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.inference.tiny_gpt2 import save_tiny_gpt2
from tests.train.test_trainer import REPO

pytestmark = pytest.mark.slow  # console scripts in processes of their own

REPO_ID = "tiny-org/tiny-gpt2"


def lay_out_hub_cache(cache: Path, repo_id: str, revision: str, files: Path) -> Path:
    """huggingface_hub's cache layout for one model revision, its files those of `files`;
    returns the snapshot folder."""
    folder = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    snapshot = folder / "snapshots" / commit
    (folder / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot.mkdir(parents=True)
    for file in sorted(files.iterdir()):
        data = file.read_bytes()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / revision).write_text(commit)
    return snapshot


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two revisions of one tiny GPT-2 (other weights each) in a fresh cache."""
    root = tmp_path_factory.mktemp("hub")
    cache = root / "cache"
    main = lay_out_hub_cache(cache, REPO_ID, "main", save_tiny_gpt2(root / "main", seed=0))
    other = lay_out_hub_cache(cache, REPO_ID, "v2", save_tiny_gpt2(root / "v2", seed=1))
    return {"cache": cache, "main": main, "v2": other, "root": root}


def _run(hub: dict[str, Path], cwd: Path, *argv: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(hub["cache"]),
    }
    return subprocess.run(
        [sys.executable, "-m", *argv], cwd=cwd, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


def _completion(hub: dict[str, Path], tmp_path: Path, init: str, name: str) -> list[int]:
    done = _run(hub, tmp_path, "tpformer.cli.generate", f"init={init}", "prompt='To be, or'",
                "max_new_tokens=6", f"hydra.run.dir={tmp_path / name}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return list(json.loads((tmp_path / name / "completions.jsonl").read_text())["output_ids"])


def test_a_hub_id_and_its_revisions_generate_as_their_snapshots(
    hub: dict[str, Path], tmp_path: Path
) -> None:
    by_id = _completion(hub, tmp_path, REPO_ID, "by_id")
    assert by_id == _completion(hub, tmp_path, str(hub["main"]), "by_dir")
    v2 = _completion(hub, tmp_path, f"{REPO_ID}@v2", "v2")
    assert v2 == _completion(hub, tmp_path, str(hub["v2"]), "v2_dir")
    assert v2 != by_id  # the revision chose other weights


def test_convert_from_hf_takes_a_hub_id(hub: dict[str, Path], tmp_path: Path) -> None:
    done = _run(hub, tmp_path, "tpformer.cli.convert", "from-hf", f"{REPO_ID}@main", "out")
    assert done.returncode == 0, done.stderr[-3000:]
    meta = json.loads((tmp_path / "out" / "checkpoints" / "step00000000" / "meta.json").read_text())
    assert meta["source"] == f"{REPO_ID}@main"
    assert (tmp_path / "out" / "checkpoints" / "step00000000" / "tokenizer").is_dir()


@pytest.mark.parametrize(
    "argv",
    [
        ["tpformer.cli.generate", "init=nobody/no-such-model", "prompt=a"],
        ["tpformer.cli.convert", "from-hf", "nobody/no-such-model", "out"],
    ],
)
def test_an_id_not_cached_while_offline_is_one_line(
    hub: dict[str, Path], tmp_path: Path, argv: list[str]
) -> None:
    done = _run(hub, tmp_path, *argv)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert (
        "nobody/no-such-model is not a local directory, and the Hugging Face Hub model"
        in (lines[0])
    )
    assert "is not in the cache" in lines[0] and "HF_HUB_OFFLINE is set" in lines[0], lines
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "out").exists()
