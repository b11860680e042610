"""The model a directory holds, read from its config alone (no weights, no torch model): a
tpformer checkpoint (meta.json records its model config) or a Hugging Face directory
(config.json). Console scripts read it before any process starts, so a wrong path or the wrong
architecture is refused in one line naming the key that gave it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpformer.checkpoint import store
from tpformer.config.records import record_from_dict
from tpformer.config.renamed import upgraded_model_keys
from tpformer.config.schema import Arch, ModelConfig
from tpformer.interop.families import model_config_from_hf
from tpformer.interop.hf_files import read_hf_config
from tpformer.interop.hub import resolve_model_dir

CHECKPOINT = "checkpoint"
HUGGING_FACE = "hugging face"


@dataclass(frozen=True)
class ModelSource:
    """A tpformer checkpoint or Hugging Face directory, and the model it holds."""

    path: Path
    kind: str
    """CHECKPOINT (meta.json) or HUGGING_FACE (config.json)."""
    config: ModelConfig

    @property
    def tokenizer_dir(self) -> Path:
        """Where its tokenizer files are, if it has any."""
        return self.path / store.TOKENIZER_DIR if self.kind == CHECKPOINT else self.path


def saved_model_config(meta: dict, directory: Path) -> ModelConfig:
    """The model config a checkpoint's meta.json records (in today's keys, whichever version
    saved it)."""
    saved = meta.get("config", {}).get("model")
    if not isinstance(saved, dict):
        raise store.CheckpointError(
            f"{directory}/meta.json records no model config (an older tpformer wrote it); "
            "re-save it with this one"
        )
    try:
        return record_from_dict(ModelConfig, upgraded_model_keys(saved), "model.")
    except (ValueError, KeyError) as err:
        raise store.CheckpointError(
            f"{directory}/meta.json: its model config cannot be read ({err}); a newer tpformer "
            "may have written it"
        ) from None


def read_model_source(
    value: str | Path, key: str, *, whole: bool = True, hub: bool = True
) -> ModelSource:
    """The model `key=value` names; FileNotFoundError or ValueError naming key and value.
    whole: a tpformer checkpoint's files must all be there at their written sizes (checked
    before any rank starts; trainer.resume=auto, which skips a damaged checkpoint for an older
    one, reads the newest's config without it). hub: a value that is no local directory may
    name a Hugging Face Hub model (interop/hub.py; not for a resumed run's checkpoint)."""
    path = resolve_model_dir(value, key) if hub else Path(value).expanduser()
    if (path / store.META).is_file():
        try:
            meta = store.verify(path, digests=False) if whole else store.read_meta(path)
        except store.CheckpointError as err:
            raise store.CheckpointError(f"{key}={value}: {err}") from None
        return ModelSource(path, CHECKPOINT, saved_model_config(meta, path))
    if (path / "config.json").is_file():
        try:
            return ModelSource(path, HUGGING_FACE, model_config_from_hf(read_hf_config(path)))
        except (ValueError, KeyError) as err:
            raise ValueError(f"{key}={value}: {err}") from None
    what = "is not a directory" if not path.is_dir() else "has neither meta.json nor config.json"
    also = ", or a Hugging Face Hub id (name or org/name, @revision)" if hub else ""
    raise FileNotFoundError(
        f"{key}={value} {what}: give a tpformer checkpoint (<run dir>/checkpoints/stepNNNNNNNN) "
        f"or a Hugging Face directory written by save_pretrained{also}"
    )


REQUIRED = {
    Arch.bert: "a BERT (tpformer checkpoint or Hugging Face BERT)",
    Arch.gpt: "a GPT (tpformer checkpoint or Hugging Face GPT-2)",
}


def require_arch(source: ModelSource, arch: Arch, key: str, job: str) -> ModelSource:
    """`source`, or ValueError naming the key when it holds another architecture."""
    if source.config.arch != arch:
        raise ValueError(
            f"{key}={source.path} holds a {source.config.arch.value} model; {job} needs "
            f"{REQUIRED[arch]}"
        )
    return source
