"""The LR schedule against transformers' schedulers: optim.warmup_style=transformers gives
get_linear_schedule_with_warmup's (and the cosine one's) learning rate at every step, warmup
steps from warmup_ratio as Trainer counts them; megatron's warmup is the same one step later."""

from __future__ import annotations

import math

import pytest
import torch

from tpformer.config.schema import OptimConfig
from tpformer.train.schedule import lr_at, warmup_steps

PEAK, STEPS = 2e-5, 37


def _transformers_lrs(decay: str, warmup: int) -> list[float]:
    from transformers import get_cosine_schedule_with_warmup, get_linear_schedule_with_warmup

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=PEAK)
    make = get_linear_schedule_with_warmup if decay == "linear" else get_cosine_schedule_with_warmup
    schedule = make(optimizer, warmup, STEPS)
    lrs = []
    for _ in range(STEPS):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    return lrs


@pytest.mark.parametrize("decay", ["linear", "cosine"])
@pytest.mark.parametrize("ratio", [0.0, 0.06, 0.1])
def test_transformers_style_is_trainers_schedule(decay: str, ratio: float) -> None:
    optim = OptimConfig(lr=PEAK, warmup_ratio=ratio, warmup_style="transformers", decay=decay)  # type: ignore[arg-type]
    warmup = warmup_steps(optim, STEPS)
    assert warmup == math.ceil(ratio * STEPS)  # Trainer's get_warmup_steps
    ours = [lr_at(s, peak=PEAK, optim=optim, max_steps=STEPS) for s in range(STEPS)]
    assert ours == pytest.approx(_transformers_lrs(decay, warmup), rel=1e-12, abs=1e-18)


def test_megatron_style_trains_from_the_first_step() -> None:
    optim = OptimConfig(lr=PEAK, warmup_steps=4)
    ours = [lr_at(s, peak=PEAK, optim=optim, max_steps=STEPS) for s in range(STEPS)]
    theirs = _transformers_lrs("linear", 4)
    assert ours[:4] == pytest.approx(theirs[1:5], rel=1e-12)  # the warmup, one step earlier
    assert ours[4:] == pytest.approx(theirs[4:], rel=1e-12)  # the decay, the same
    assert theirs[0] == 0.0 < ours[0]
