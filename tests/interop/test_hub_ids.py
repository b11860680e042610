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
from pathlib import Path

import pytest

from tests.cli.bad_input_cases import run_cases
from tests.docs.commands import arguments, documented
from tests.inference.tiny_gpt2 import save_tiny_gpt2

pytestmark = pytest.mark.slow  # console scripts in processes of their own

REPO_ID = "openai-community/gpt2"  # a tiny stand-in, laid out under docs/hf.md's id
GENERATE_BY_ID = documented("tpformer-generate init=openai-community/gpt2@main")
CONVERT_BY_ID = documented("tpformer-convert from-hf openai-community/gpt2")


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


GENERATE = "tpformer.cli.generate:main"
CONVERT = "tpformer.cli.convert:main"
OFFLINE_MISSES = {
    "generate_miss": (GENERATE, ["init=nobody/no-such-model", "prompt=a"]),
    "convert_miss": (CONVERT, ["from-hf", "nobody/no-such-model", "missing"]),
}


@pytest.fixture(scope="module")
def ran(hub: dict[str, Path]) -> dict[str, tuple]:
    """Every command of this file in one process (tests/cli/bad_input_cases.py's runner), with
    HF_HUB_OFFLINE=1 and the laid-out cache: name -> (exit code, stdout, stderr, left)."""
    work = hub["root"] / "work"
    work.mkdir()

    def generate(init: str, name: str) -> tuple[str, list[str], str]:
        """docs/hf.md's command, with `init` for its id@main."""
        _, argv = arguments(GENERATE_BY_ID, {f"{REPO_ID}@main": init})
        return GENERATE, [*argv, f"hydra.run.dir={work / name}"], str(work)

    cases = {
        "by_id": generate(f"{REPO_ID}@main", "by_id"),
        "by_dir": generate(str(hub["main"]), "by_dir"),
        "v2": generate(f"{REPO_ID}@v2", "v2"),
        "v2_dir": generate(str(hub["v2"]), "v2_dir"),
        "convert": (CONVERT, arguments(CONVERT_BY_ID)[1], str(work)),  # into runs/gpt2
        **{name: (script, argv, str(work)) for name, (script, argv) in OFFLINE_MISSES.items()},
    }
    env = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub["cache"])}
    outcomes = run_cases(list(cases.values()), env)
    return {"work": work, **dict(zip(cases, outcomes, strict=True))}


def _completion(ran: dict, name: str) -> list[int]:
    code, _, stderr, _ = ran[name]
    assert code in (0, None), stderr[-3000:]
    return list(json.loads((ran["work"] / name / "completions.jsonl").read_text())["output_ids"])


def test_a_hub_id_and_its_revisions_generate_as_their_snapshots(ran: dict) -> None:
    by_id = _completion(ran, "by_id")
    assert by_id == _completion(ran, "by_dir")
    v2 = _completion(ran, "v2")
    assert v2 == _completion(ran, "v2_dir")
    assert v2 != by_id  # the revision chose other weights


def test_convert_from_hf_takes_a_hub_id(ran: dict) -> None:
    code, _, stderr, _ = ran["convert"]
    assert code in (0, None), stderr[-3000:]
    step = ran["work"] / "runs" / "gpt2" / "checkpoints" / "step00000000"
    assert json.loads((step / "meta.json").read_text())["source"] == REPO_ID
    assert (step / "tokenizer").is_dir()


@pytest.mark.parametrize("name", list(OFFLINE_MISSES))
def test_an_id_not_cached_while_offline_is_one_line(ran: dict, name: str) -> None:
    code, _, stderr, left = ran[name]
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1, stderr
    assert (
        "nobody/no-such-model is not a local directory, and the Hugging Face Hub model"
        in (lines[0])
    )
    assert "is not in the cache" in lines[0] and "HF_HUB_OFFLINE is set" in lines[0], lines
    assert not left and not (ran["work"] / "missing").exists()
