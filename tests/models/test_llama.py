"""The Llama family (rotary positions, RMSNorm, SwiGLU, grouped-query attention, no biases, an
untied LM head) as options of the GPT decoder: Hugging Face `LlamaForCausalLM` checkpoints
written by save_pretrained load at TP=1, 2 and 4 with HF's logits, export back unchanged, and
refused shapes are named."""

from pathlib import Path

import pytest
import torch
import transformers

from tests.cli.forked import convert
from tests.dist import run_distributed
from tests.tolerances import assert_rel_close
from tpformer.interop.families import model_config_from_hf
from tpformer.interop.hf import load_hf_model, save_hf_checkpoint
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


def _hf_llama(
    rope: str, kv_heads: int = 4, tied: bool = False, qwen: bool = False
) -> transformers.LlamaForCausalLM:
    """8 heads of 8 dimensions, `kv_heads` key/value heads; the dynamic variant's trained
    context (8) is shorter than the batch (12 positions), so its base grows. `qwen`: a
    Qwen2ForCausalLM (Llama's shape with query, key and value biases)."""
    torch.manual_seed(0)
    parameters = {"rope_theta": 10000.0, **(ROPES[rope] or {"rope_type": "default"})}
    kind = transformers.Qwen2Config if qwen else transformers.LlamaConfig
    config = kind(
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
    causal = transformers.Qwen2ForCausalLM if qwen else transformers.LlamaForCausalLM
    model = causal(config).eval()
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


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("world", "rope", "kv_heads", "tied", "qwen"),
    [
        (1, "default", 4, False, False),
        (2, "llama3", 2, False, False),
        (4, "default", 4, True, False),
        (2, "linear", 8, False, False),
        (1, "dynamic", 1, False, False),
        (4, "default", 2, False, False),
        (2, "linear", 1, True, False),
        (2, "default", 2, True, True),
        (4, "default", 2, False, True),
    ],
)
def test_a_llama_checkpoint_loads_with_hf_logits_and_exports_back(
    tmp_path: Path, world: int, rope: str, kv_heads: int, tied: bool, qwen: bool
) -> None:
    """TP=1/2/4; grouped-query (4 and 2 groups), multi-head (8) and multi-query (1) attention,
    key/value heads split over TP or (fewer than the ranks) replicated; each RoPE variant;
    tied and untied LM heads; Qwen2 (query, key and value biases) exports as Qwen2."""
    hf = _hf_llama(rope, kv_heads, tied, qwen)
    hf.save_pretrained(tmp_path / "hf")
    with torch.no_grad():
        expected = hf(input_ids=_ids()).logits
    exported = tmp_path / "exported"
    for out in run_distributed(
        _load_compare_export, world, str(tmp_path / "hf"), str(exported), tensor=world
    ):
        assert_rel_close(out, expected, HF_REL, f"llama {rope} logits")
    reloaded = type(hf).from_pretrained(exported).state_dict()
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
        (
            {"model_type": "qwen2", "use_sliding_window": True, "sliding_window": 64},
            "sliding_window=64",
        ),
        ({"model_type": "qwen3"}, "model_type='qwen3' is not supported"),
    ],
)
def test_a_llama_shape_tpformer_does_not_build_is_refused_by_name(keys: dict, named: str) -> None:
    hf = {**_hf_llama("default").config.to_dict(), **keys}
    with pytest.raises(ValueError, match="not supported") as refused:
        model_config_from_hf(hf)
    assert named in str(refused.value)


PROMPTS = [[5, 17, 33, 2], [9, 8], [1, 2, 3, 4, 5, 6, 7], [40]]
NEW = 16


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Weights at std 0.3, so a random model's greedy completions vary from token to token."""
    directory = tmp_path_factory.mktemp("tiny_llama")
    hf = _hf_llama("llama3", kv_heads=2)
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3) if p.dim() > 1 else p.fill_(1.0)
    hf.save_pretrained(directory)
    return directory


def _greedy(ctx: ParallelContext, directory: str) -> list[list[int]]:
    from tpformer.convert import load_causal_lm
    from tpformer.inference.generation import GenerationSettings, generate
    from tpformer.inference.sampling import Sampling

    model, _, _ = load_causal_lm(Path(directory), ctx)
    return generate(model.eval(), PROMPTS, GenerationSettings(NEW, Sampling()), torch.Generator())


def test_greedy_tokens_equal_transformers_generate_at_tp1_and_tp2(llama_dir: Path) -> None:
    """Each prompt alone through LlamaForCausalLM.generate (its KV cache), all four as one
    left-padded batch here (rotary positions per row from the padding), at TP=1 and TP=2."""
    hf = transformers.LlamaForCausalLM.from_pretrained(llama_dir).eval()
    ours = _greedy(ParallelContext.single(device="cpu"), str(llama_dir))
    for prompt, got in zip(PROMPTS, ours, strict=True):
        want = hf.generate(
            torch.tensor([prompt]), max_new_tokens=NEW, do_sample=False, pad_token_id=0,
            eos_token_id=None,
        )[0, len(prompt) :].tolist()  # fmt: skip
        assert got == want, (prompt, got, want)
    assert all(len(set(c)) > 3 for c in ours), ours  # not a degenerate model
    for got in run_distributed(_greedy, 2, str(llama_dir), tensor=2):
        assert got == ours


def _cache_bytes(ctx: ParallelContext, directory: str) -> tuple[int, int]:
    from tpformer.convert import load_causal_lm
    from tpformer.inference.generation import new_caches
    from tpformer.layers.kv_cache import kv_cache_bytes

    model, _, _ = load_causal_lm(Path(directory), ctx)
    c = model.config
    caches = new_caches(model, 3, 20)
    formula = kv_cache_bytes(
        layers=c.num_layers, batch=3, kv_heads=c.kv_heads, tp=ctx.tp.size, max_length=20,
        head_dim=c.hidden_size // c.num_heads, itemsize=4,
    )  # fmt: skip
    return sum(cache.nbytes for cache in caches), formula


@pytest.mark.slow  # over ~5 s: the slow tier
def test_the_kv_cache_holds_the_key_value_heads_unexpanded(llama_dir: Path) -> None:
    """2 key/value heads of 8 query heads, cached unexpanded: both at TP=1 (a quarter of a
    multi-head cache), one per rank at TP=2, and at TP=4 (replicated) the one each rank's two
    query heads read."""
    mha = 2 * 2 * 3 * 8 * 20 * 8 * 4  # layers x (k, v) x batch x heads x positions x dims x 4
    one = _cache_bytes(ParallelContext.single(device="cpu"), str(llama_dir))
    assert one == (mha // 4,) * 2
    for world in (2, 4):
        for got, formula in run_distributed(_cache_bytes, world, str(llama_dir), tensor=world):
            assert got == formula == mha // 8


@pytest.mark.slow  # over ~5 s: the slow tier
def test_tpformer_convert_takes_a_llama_both_ways(tmp_path: Path) -> None:
    """`tpformer-convert from-hf` makes a tpformer checkpoint of a LlamaForCausalLM directory
    and `to-hf` writes it back: the same tensors, and HF's logits from the round trip."""
    hf = _hf_llama("llama3", kv_heads=2)
    hf.save_pretrained(tmp_path / "hf")
    convert("from-hf", str(tmp_path / "hf"), str(tmp_path / "ours"))
    checkpoint = tmp_path / "ours" / "checkpoints" / "step00000000"
    convert("to-hf", str(checkpoint), str(tmp_path / "back"))
    back = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "back").eval()
    for key, tensor in hf.state_dict().items():
        assert torch.equal(back.state_dict()[key], tensor), key
    with torch.no_grad():
        assert torch.equal(back(input_ids=_ids()).logits, hf(input_ids=_ids()).logits)
