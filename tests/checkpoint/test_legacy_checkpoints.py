"""Checkpoints written before the model's variant groups (tpformer f38df97, flat keys: rope_*,
local_window, norm, pre_norm, ...) still load: their config is read in today's groups, their
model gives the logits it gave then, and it exports to the Hugging Face class it would have.

tests/checkpoint/data/ was written by that commit: for each of a ModernBERT (rotary with two
bases, local attention, pre-norm, GeGLU, no biases) and a Llama (llama3 rotary scaling, grouped
query heads, Qwen2's q/k/v biases), `store.save` of the freshly built model's engine through
`store.checkpoint_meta`, and the model's logits for two seeded rows of 12 ids (logits.pt)."""

from pathlib import Path

import pytest
import torch
import transformers

from tests.tolerances import FP32_MODEL_REL, assert_rel_close
from tpformer.checkpoint.source import read_model_source
from tpformer.config.presets import preset
from tpformer.config.schema import LocalAttentionConfig, ModelConfig, RopeScaling, RotaryConfig
from tpformer.convert import load_checkpoint_model, to_hf
from tpformer.parallel.context import ParallelContext

DATA = Path(__file__).parent / "data"
SMALL = {"vocab_size": 99, "hidden_size": 32, "num_heads": 4, "intermediate_size": 48,
         "max_position_embeddings": 32, "pad_vocab_to": 8, "dropout": 0.0,
         "attention_dropout": 0.0}  # fmt: skip

TODAY: dict[str, ModelConfig] = {
    "modernbert": preset(
        "modernbert_tiny",
        num_layers=3,
        local_attention=LocalAttentionConfig(window=4, global_every=3),
        **SMALL,
    ),
    "llama": preset(
        "llama_tiny",
        num_kv_heads=2,
        num_layers=2,
        qkv_bias=True,
        rotary=RotaryConfig(scaling=RopeScaling.llama3, factor=8.0, original_max_positions=16),
        **SMALL,
    ),
}
"""What each saved model is in today's keys."""

HF_CLASS = {"modernbert": "ModernBertForMaskedLM", "llama": "Qwen2ForCausalLM"}


def _checkpoint(name: str) -> Path:
    return DATA / name / "checkpoints" / "step00000000"


@pytest.mark.parametrize("name", sorted(TODAY))
def test_an_old_checkpoint_reads_in_todays_groups_and_gives_its_logits(name: str) -> None:
    assert read_model_source(_checkpoint(name), "init").config == TODAY[name]
    saved = torch.load(DATA / name / "logits.pt")
    model = load_checkpoint_model(_checkpoint(name), ParallelContext.single(device="cpu"))
    with torch.no_grad():
        result = model.eval()(saved["input_ids"])
    logits = result.mlm_logits if name == "modernbert" else result.logits
    assert_rel_close(logits, saved["logits"], FP32_MODEL_REL, f"{name} logits")


@pytest.mark.parametrize("name", sorted(TODAY))
def test_an_old_checkpoint_exports_to_hugging_face(name: str, tmp_path: Path) -> None:
    out = to_hf(_checkpoint(name), tmp_path / "hf")
    hf = getattr(transformers, HF_CLASS[name]).from_pretrained(out).eval()
    saved = torch.load(DATA / name / "logits.pt")
    with torch.no_grad():
        theirs = hf(input_ids=saved["input_ids"]).logits
    assert_rel_close(theirs, saved["logits"][..., :99], FP32_MODEL_REL, f"{name} via HF")
