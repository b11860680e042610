"""Models by name: `init=bert-base-uncased`, `init=openai-community/gpt2@main` (a revision
after `@`: a branch, tag or commit) and `tpformer-convert from-hf NAME` resolve a Hugging Face
Hub id as `from_pretrained` does, through huggingface_hub: its cache (HF_HOME, HF_HUB_CACHE),
HF_HUB_OFFLINE and its token (HF_TOKEN or `hf auth login`). A local directory of that name wins,
as it does for `from_pretrained`. Only the files tpformer reads are fetched: the config, the
weights and the tokenizer."""

from __future__ import annotations

from pathlib import Path

HUB_FILES = [
    "config.json",
    "*.safetensors",
    "*.safetensors.index.json",
    "vocab.txt",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
]
"""What a model directory is read for (interop/hf.py, interop/hf_files.py, the tokenizers)."""


def hub_id(value: str) -> tuple[str, str | None] | None:
    """(repo id, revision) when `value` reads as a Hub id (`name`, `org/name`, either with
    `@revision`), else None."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    repo, _, revision = value.partition("@")
    if value.startswith((".", "/", "~")) or repo.count("/") > 1:
        return None
    try:
        validate_repo_id(repo)
    except HFValidationError:
        return None
    return repo, revision or None


def resolve_model_dir(value: str | Path, key: str) -> Path:
    """The directory `key=value` names: the local one, or the Hub snapshot of the id (from the
    cache, downloading what is missing unless offline). FileNotFoundError in one line naming
    key and value when neither is there."""
    path = Path(value).expanduser()
    named = hub_id(str(value)) if not path.exists() else None
    if named is None:
        return path
    import huggingface_hub
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, revision = named
    named_revision = f"{repo}@{revision}" if revision else repo
    try:
        return Path(
            huggingface_hub.snapshot_download(repo, revision=revision, allow_patterns=HUB_FILES)
        )
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if huggingface_hub.constants.HF_HUB_OFFLINE else "offline?"
        raise FileNotFoundError(
            f"{key}={value} is not a local directory, and the Hugging Face Hub model "
            f"{named_revision} is not in the cache ({huggingface_hub.constants.HF_HUB_CACHE}) "
            f"and cannot be downloaded ({why}): download it where the Hub is reachable "
            f"(hf download {repo}) or give a directory"
        ) from None
    except (RepositoryNotFoundError, RevisionNotFoundError) as err:
        reason = type(err).__name__.removesuffix("Error")
        raise FileNotFoundError(
            f"{key}={value} is not a local directory, and the Hugging Face Hub answers "
            f"{reason} for {named_revision} (a private or gated model needs HF_TOKEN or "
            "`hf auth login`)"
        ) from None
    except HfHubHTTPError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise FileNotFoundError(
            f"{key}={value}: downloading it from the Hugging Face Hub failed ({first})"
        ) from None
