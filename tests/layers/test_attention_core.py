"""The attention core is chosen once, when a layer is built (layers/attention_core.py): which
core each layer of a model gets under each rng mode and dropout, its window, the startup
plan's line, and that selective recomputation wraps the core the layer calls. The cores'
numbers are held where they meet their references: tests/layers/test_attention.py and
test_ring_attention.py, the layout and fast-mode tests, the Hugging Face parity tests."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tpformer.config.presets import preset
from tpformer.layers.attention import ParallelSelfAttention
from tpformer.layers.attention_core import (
    AttentionCore,
    ExactCore,
    FusedCore,
    expanded_kv,
    windowed_flash,
    windowed_flash_runs,
)
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.train.startup_report import attention_line


def _cores(model_name: str, rng: str, **overrides: object) -> list[AttentionCore]:
    config = preset(model_name, **overrides)
    ctx = ParallelContext.single(device="cpu", rng=rng)
    model = build_model(config, ctx, task="pretraining" if config.arch == "bert" else "causal_lm")
    return [m for m in model.modules() if isinstance(m, AttentionCore)]


@pytest.mark.parametrize(
    ("rng", "dropout", "kind"),
    [("exact", 0.1, ExactCore), ("fast", 0.1, FusedCore), ("exact", 0.0, FusedCore)],
)
def test_each_layer_gets_the_core_its_rng_and_dropout_need(
    rng: str, dropout: float, kind: type
) -> None:
    cores = _cores("bert_tiny", rng, attention_dropout=dropout)
    assert len(cores) == preset("bert_tiny").num_layers
    assert all(type(c) is kind and c.reach == 0 for c in cores), cores


def test_local_layers_get_their_reach_and_the_plan_names_each_kind() -> None:
    """modernbert_tiny: 4 layers, global every 3rd (layers 0 and 3), window 32 elsewhere;
    attention dropout 0.1 (the preset's is 0, as ModernBERT's)."""
    config = preset("modernbert_tiny", attention_dropout=0.1)
    cores = _cores("modernbert_tiny", "fast", attention_dropout=0.1)
    assert [c.reach for c in cores] == [0, 16, 16, 0], config.local_attention
    ctx = ParallelContext.single(device="cpu", rng="fast")
    model = build_model(config, ctx, task="pretraining")
    assert attention_line(model) == (
        "attention: 2 layers sdpa, the kernel's dropout (rng=fast); "
        "2 layers sdpa, window 32 (a band mask: flash's window draws no attention dropout), "
        "the kernel's dropout (rng=fast)"
    )
    plain = build_model(preset("modernbert_tiny"), ctx, task="pretraining")  # dropout 0
    assert attention_line(plain) == (
        "attention: 2 layers sdpa; 2 layers sdpa, window 32 (flash's varlen window for "
        "unmasked 16-bit batches on an accelerator; else a band mask)"
    )
    exact = build_model(
        config, ParallelContext.single(device="cpu", rng="exact"), task="pretraining"
    )
    assert attention_line(exact).startswith(
        "attention: 2 layers explicit (rng=exact: the TP=1 model's dropout masks"
    )


def test_a_local_core_attends_within_its_window_only() -> None:
    """A key past the reach changes nothing; one inside it does (the band is the core's)."""
    (core, *_) = [c for c in _cores("modernbert_tiny", "fast") if c.reach]
    core.eval()
    q, k, v = (torch.randn(1, 2, 40, 8) for _ in range(3))
    out = core(q, k, v, None, False)
    far, near = v.clone(), v.clone()
    far[:, :, 39] += 1.0  # 39 positions from query 0, past the reach of 16
    near[:, :, 10] += 1.0
    assert torch.equal(core(q, k, far, None, False)[:, :, 0], out[:, :, 0])
    assert not torch.allclose(core(q, k, near, None, False)[:, :, 0], out[:, :, 0])


@pytest.mark.parametrize("masked", [False, True])
def test_grouped_key_value_heads_are_read_in_place_where_the_kernel_takes_them(
    masked: bool,
) -> None:
    """8 query heads over 2 key/value heads, bf16: without a mask (flash, `enable_gqa`) the
    attention keeps its keys and values at 2 heads, so the [b, 8, s, d] tensors it keeps are
    the queries and the output only; with a padding mask (CUDA's memory-efficient kernel takes
    no groups) they are expanded first, and kept at 8 heads too. Both give what SDPA gives
    the keys and values expanded by hand."""
    ctx = ParallelContext.single(device="cpu")
    attention = ParallelSelfAttention(64, 8, ctx, attention_dropout=0.0, causal=not masked,
                                      kv_heads=2).to(torch.bfloat16)  # fmt: skip
    x = torch.randn(2, 16, 64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    mask = torch.ones(2, 1, 1, 16, dtype=torch.bool)
    mask[1, ..., 12:] = False
    mask = mask if masked else None
    kept: list[tuple[int, ...]] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(tuple(t.shape)) or t,
                                                  lambda t: t):  # fmt: skip
        out = attention(x.requires_grad_(), mask)
    assert kept.count((2, 8, 16, 8)) == (4 if masked else 2), kept
    assert (
        attention.core.describe()
        == "sdpa, grouped key/value heads in place when 16-bit and unmasked"
    )
    q, k, v = attention._project(x)
    k, v = expanded_kv(q, k, v)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=not masked)
    expected = attention.out(reference.transpose(1, 2).reshape(2, 16, 64))
    assert torch.equal(out, expected)


def _reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, *, window_size, enable_gqa):
    """torch.nn.attention.varlen.varlen_attn's documented semantics, written out densely (the
    CPU has no flash kernel): each sequence of the flattened batch on its own, key j attended
    by query i when i - left <= j <= i + right, key/value heads repeated for their groups."""
    assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k) and max_q == max_k
    left, right = window_size
    out = []
    for start, stop in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
        qi, ki, vi = (t[start:stop].transpose(0, 1) for t in (q, k, v))  # [heads, n, d]
        if enable_gqa:
            ki, vi = (t.repeat_interleave(qi.shape[0] // t.shape[0], 0) for t in (ki, vi))
        i = torch.arange(stop - start)
        band = (i[None, :] >= i[:, None] - left) & (i[None, :] <= i[:, None] + right)
        out.append(F.scaled_dot_product_attention(qi, ki, vi, attn_mask=band).transpose(0, 1))
    return torch.cat(out)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_flash_window_glue_gives_the_band_masked_core(monkeypatch, kv_heads: int) -> None:
    """windowed_flash flattens the batch into one sequence per sample for flash's varlen kernel
    with window_size (reach, reach), grouped key/value heads in place: with the kernel's
    documented semantics standing in for it (the CPU has no flash), equal to the band-masked
    SDPA every other device runs, values and gradients (fp32, 1e-6); a reach one too small
    differs (negative control)."""
    import torch.nn.attention.varlen as varlen

    monkeypatch.setattr(varlen, "varlen_attn", _reference_varlen)
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 4, 20, 8, generator=g, requires_grad=True)
    k, v = (torch.randn(3, kv_heads, 20, 8, generator=g, requires_grad=True) for _ in range(2))
    core = next(c for c in _cores("modernbert_tiny", "fast") if c.reach).eval()
    core.reach = 5  # the band the core builds where flash does not run
    flash = windowed_flash(q, k, v, 5)
    band = core._banded(None, 20, q.device)
    dense = F.scaled_dot_product_attention(q, *expanded_kv(q, k, v), attn_mask=band)
    assert float((flash - dense).detach().abs().max()) < 1e-6
    grads = torch.autograd.grad(flash.square().sum(), (q, k, v))
    expected = torch.autograd.grad(dense.square().sum(), (q, k, v))
    for got, want in zip(grads, expected):
        assert float((got - want).abs().max()) < 1e-5
    assert float((windowed_flash(q, k, v, 4) - dense).detach().abs().max()) > 1e-3


def test_the_flash_window_runs_where_flash_does() -> None:
    """16-bit on CUDA or meta (the dry run's GPU), no padding mask, no dropout to draw, an
    encoder."""
    meta = torch.empty(1, 2, 8, 4, device="meta", dtype=torch.bfloat16)
    mask = torch.ones(1, 1, 1, 8, dtype=torch.bool, device="meta")
    assert windowed_flash_runs(meta, None, 0.0, False)
    assert not windowed_flash_runs(meta, mask, 0.0, False)
    assert not windowed_flash_runs(meta, None, 0.1, False)
    assert not windowed_flash_runs(meta, None, 0.0, True)  # a decoder's window is one-sided
    assert not windowed_flash_runs(meta.float(), None, 0.0, False)
    cpu = torch.empty(1, 2, 8, 4, dtype=torch.bfloat16)
    assert not windowed_flash_runs(cpu, None, 0.0, False)
