"""The Llama family (rotary positions, RMSNorm, SwiGLU, grouped-query attention, no biases, an
untied LM head) as options of the GPT decoder: Hugging Face `LlamaForCausalLM` checkpoints
written by save_pretrained load at TP=1, 2 and 4 with HF's logits, export back unchanged, and
refused shapes are named."""

from pathlib import Path

import pytest
import torch
import transformers

from tests.dist import run_distributed
from tests.tolerances import assert_rel_close
from tpformer.interop.hf import load_hf_model, save_hf_checkpoint
from tpformer.interop.hf_keys import model_config_from_hf
from tpformer.parallel.comm import gather_from_tp
from tpformer.parallel.context import ParallelContext

HF_REL = 1e-5
"""fp32, the same math as HF (as tests/models/test_hf.py): kernels and reduction order differ."""
VOCAB = 99
ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
}  # fmt: skip


def _hf_llama(rope: str, kv_heads: int = 4, tied: bool = False) -> transformers.LlamaForCausalLM:
    """8 heads of 8 dimensions, `kv_heads` key/value heads; the dynamic variant's trained
    context (8) is shorter than the batch (12 positions), so its base grows."""
    torch.manual_seed(0)
    parameters = {"rope_theta": 10000.0, **(ROPES[rope] or {"rope_type": "default"})}
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=kv_heads,
        max_position_embeddings=8 if rope == "dynamic" else 32,
        rope_parameters=parameters,
        tie_word_embeddings=tied,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # RMSNorm weights start at one: make every tensor count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 12), generator=torch.Generator().manual_seed(1))


def _load_compare_export(ctx: ParallelContext, source: str, target: str) -> torch.Tensor:
    model = load_hf_model(source, ctx).eval()
    save_hf_checkpoint(model, ctx, target)
    with torch.no_grad():
        logits = model(_ids()).logits
    return gather_from_tp(logits, ctx.tp)[..., :VOCAB]


@pytest.mark.parametrize(
    ("world", "rope", "kv_heads", "tied"),
    [
        (1, "default", 4, False),
        (2, "llama3", 2, False),
        (4, "default", 4, True),
        (2, "linear", 8, False),
        (1, "dynamic", 1, False),
    ],
)
def test_a_llama_checkpoint_loads_with_hf_logits_and_exports_back(
    tmp_path: Path, world: int, rope: str, kv_heads: int, tied: bool
) -> None:
    """TP=1/2/4; grouped-query (4 and 2 groups), multi-head (8) and multi-query (1) attention;
    each RoPE variant; tied and untied LM heads."""
    hf = _hf_llama(rope, kv_heads, tied)
    hf.save_pretrained(tmp_path / "hf")
    with torch.no_grad():
        expected = hf(input_ids=_ids()).logits
    exported = tmp_path / "exported"
    for out in run_distributed(
        _load_compare_export, world, str(tmp_path / "hf"), str(exported), tensor=world
    ):
        assert_rel_close(out, expected, HF_REL, f"llama {rope} logits")
    reloaded = transformers.LlamaForCausalLM.from_pretrained(exported).state_dict()
    for key, tensor in hf.state_dict().items():
        assert torch.equal(reloaded[key], tensor), key


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
        ({"head_dim": 16}, "head_dim=16"),
        ({"sliding_window": 128, "model_type": "mistral"}, "sliding_window=128"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type='yarn'"),
        ({"model_type": "qwen2"}, "model_type='qwen2' is not supported"),
    ],
)
def test_a_llama_shape_tpformer_does_not_build_is_refused_by_name(keys: dict, named: str) -> None:
    hf = {**_hf_llama("default").config.to_dict(), **keys}
    with pytest.raises(ValueError, match="not supported") as refused:
        model_config_from_hf(hf)
    assert named in str(refused.value)
