"""Sliding-window perplexity: the windows score every token once (after the first, and each
non-overlapping window's first), and the loss equals transformers' on the same windows within
1e-4 relative at TP=1, TP=2 and DP=2."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.dist import run_distributed
from tests.inference.tiny_gpt2 import save_tiny_gpt2
from tpformer.convert import load_causal_lm
from tpformer.inference.perplexity import Perplexity, perplexity, sliding_windows
from tpformer.parallel.context import ParallelContext

PERPLEXITY_REL = 1e-4
TOKENS = 200


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"))


def _stream(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (TOKENS,), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(("seq", "stride"), [(64, 64), (64, 16), (50, 7), (300, 300)])
def test_windows_score_each_token_once(seq: int, stride: int) -> None:
    windows = sliding_windows(TOKENS, seq, stride)
    scored = [t for w in windows for t in range(w.scored_from, w.end)]
    assert scored == sorted(set(scored)) and scored[-1] == TOKENS - 1
    unscored = set(range(TOKENS)) - set(scored)
    if stride < seq:
        assert unscored == {0}
        assert all(w.scored_from - w.begin >= seq - stride for w in windows[1:])
    else:  # each window's first token has no context
        assert unscored == {w.begin for w in windows}
    assert all(w.end - w.begin <= seq for w in windows)


def _transformers_perplexity(directory: Path, seq: int, stride: int) -> Perplexity:
    """The same windows through GPT2LMHeadModel, summed in float64."""
    import transformers

    hf = transformers.GPT2LMHeadModel.from_pretrained(directory).eval()
    stream = _stream(hf.config.vocab_size)
    nll, count = 0.0, 0
    windows = sliding_windows(TOKENS, seq, stride)
    with torch.no_grad():
        for w in windows:
            logits = hf(stream[None, w.begin : w.end]).logits[0, :-1]
            targets = stream[w.begin + 1 : w.end].clone()
            targets[: w.scored_from - w.begin - 1] = -100
            nll += float(F.cross_entropy(logits, targets, reduction="sum").double())
            count += int((targets != -100).sum())
    return Perplexity(count, nll, len(windows))


def _ours(ctx: ParallelContext, directory: str, seq: int, stride: int) -> Perplexity:
    model, _, _ = load_causal_lm(Path(directory), ctx)
    stream = _stream(model.config.vocab_size)
    return perplexity(model.eval(), stream, ctx, seq_length=seq, stride=stride, batch_size=3)


@pytest.mark.parametrize(("seq", "stride"), [(64, 64), (64, 16)])
def test_perplexity_equals_transformers_at_every_layout(
    gpt2_dir: Path, seq: int, stride: int
) -> None:
    want = _transformers_perplexity(gpt2_dir, seq, stride)
    got = [_ours(ParallelContext.single(device="cpu"), str(gpt2_dir), seq, stride)]
    got += run_distributed(_ours, 2, str(gpt2_dir), seq, stride, tensor=2)
    got += run_distributed(_ours, 2, str(gpt2_dir), seq, stride)  # DP=2: windows split
    for result in got:
        assert result.tokens == want.tokens and result.windows == want.windows
        assert abs(result.perplexity - want.perplexity) <= PERPLEXITY_REL * want.perplexity, (
            result,
            want,
        )
    assert math.isfinite(want.perplexity) and want.perplexity > 1


def test_too_short_or_a_stride_past_the_window_is_refused() -> None:
    with pytest.raises(ValueError, match="perplexity needs at least 2"):
        sliding_windows(1, 8, 8)
    with pytest.raises(ValueError, match=r"stride=9 must be in \[1, seq_length=8\]"):
        sliding_windows(100, 8, 9)
