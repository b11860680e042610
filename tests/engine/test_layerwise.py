"""LARS and NovoGrad on the engine's flat views against per-parameter single-process references,
at every ZeRO stage with and without offload, over TP x DP = 1x1, 2x2 and 1x4 (LAMB's test is
in test_zero.py)."""

from dataclasses import replace

import pytest
import torch

from tests.dist import run_distributed
from tests.engine.test_zero import ADAMW_REL, OPTIM, STEPS, _batch, _model, engine_cases
from tests.tolerances import assert_rel_close
from tpformer.config.schema import OptimConfig
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import full_state_dict

LARS = replace(OPTIM, name="lars", lr=0.5, trust_coefficient=0.02, momentum=0.9)
NOVOGRAD = replace(OPTIM, name="novograd", lr=3e-3, beta1=0.9, beta2=0.98)
CASES = [(stage, offload) for stage in (0, 1, 2, 3) for offload in ("none", "optimizer")]


def _reference(optim: OptimConfig) -> dict[str, torch.Tensor]:
    """The optimizer written out per parameter on the single-process model."""
    ctx = ParallelContext.single(device="cpu")
    model = _model(ctx)
    buffers = {p: torch.zeros_like(p) for p in model.parameters()}
    second: dict[torch.nn.Parameter, torch.Tensor] = {}
    for step in range(STEPS):
        ctx.rng.set_position(step, 0)
        model(**_batch(step)).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip_grad)
        with torch.no_grad():
            for p in model.parameters():
                decayed = p.dim() >= 2  # biases and LayerNorms: no decay (nor LARS's ratio)
                wd = optim.weight_decay if decayed else 0.0
                if optim.name == "lars":
                    ratio = 1.0
                    w_norm, g_norm = p.double().norm(), p.grad.double().norm()
                    if decayed and w_norm > 0 and g_norm + wd * w_norm > 0:
                        ratio = float(optim.trust_coefficient * w_norm / (g_norm + wd * w_norm))
                    buffers[p].mul_(optim.momentum).add_(optim.lr * ratio * (p.grad + wd * p))
                    p.sub_(buffers[p])
                else:  # novograd
                    square = float(p.grad.double().norm()) ** 2
                    v = (
                        square
                        if p not in second
                        else (optim.beta2 * float(second[p]) + (1 - optim.beta2) * square)
                    )
                    second[p] = torch.tensor(v, dtype=torch.float32)
                    scaled = p.grad / (float(second[p]) ** 0.5 + optim.eps) + wd * p
                    buffers[p].mul_(optim.beta1).add_(scaled)
                    p.sub_(optim.lr * buffers[p])
                p.grad = None
    return full_state_dict(model, ctx.tp)


def _cases(ctx: ParallelContext, optim: OptimConfig) -> list[dict[str, torch.Tensor]]:
    return engine_cases(ctx, optim, CASES)


@pytest.mark.sweep
@pytest.mark.parametrize("optim", [LARS, NOVOGRAD], ids=["lars", "novograd"])
@pytest.mark.parametrize(("tp", "dp"), [(1, 1), (2, 2), (1, 4)])
def test_layerwise_optimizer_matches_per_parameter_reference(
    optim: OptimConfig, tp: int, dp: int
) -> None:
    """Whole-parameter norms (||w||, ||g||) over views, DP shards and TP ranks."""
    reference = _reference(optim)
    initial = full_state_dict(
        _model(ParallelContext.single(device="cpu")), ParallelContext.single().tp
    )
    assert max((initial[k] - v).abs().max().item() for k, v in reference.items()) > 1e-3
    if tp * dp == 1:
        results = [_cases(ParallelContext.single(device="cpu"), optim)]
    else:
        results = run_distributed(_cases, tp * dp, optim, tensor=tp)
    for rank_result in results:
        for (stage, offload), params in zip(CASES, rank_result):
            for name, expected in reference.items():
                assert_rel_close(
                    params[name],
                    expected,
                    ADAMW_REL,
                    f"{optim.name} stage {stage} {offload} {name}",
                )
