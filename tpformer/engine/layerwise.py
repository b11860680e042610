"""Layer-wise optimizers on the engine's flat master views: LAMB, LARS and NovoGrad.

Each scales or normalizes a *logical* parameter's step by norms of that whole parameter (its
weights, gradient or Adam update). A parameter's pieces are spread over the flat views of this
rank, over the DP shards (ZeRO stages 1-3) and, when TP-sharded, over the TP ranks, so the
norms are summed per parameter over all of them -- one all-reduce of a [segments, k] tensor
over DP and one over TP per step -- and the step equals the per-parameter single-process
optimizer at any layout. Per-element state lives under names the engine's logical state saves
and reshards (`SLOTS`); NovoGrad's per-layer second moment is kept expanded to its elements so
it reshards like the rest.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tpformer.parallel.comm import all_reduce
from tpformer.parallel.context import GroupHandle

Piece = tuple[int, int, int, bool]
"""(segment id, start, stop, TP-sharded) of one logical parameter inside a flat view."""


class FlatLayerwise(torch.optim.Optimizer):
    """Base: per-element slots, whole-parameter norms across views, DP shards and TP ranks."""

    SLOTS: tuple[str, ...] = ()

    def __init__(
        self,
        groups: list[dict],
        defaults: dict,
        *,
        pieces: dict[Tensor, list[Piece]],
        num_segments: int,
        tp: GroupHandle,
        dp: GroupHandle | None,
        comm_device: torch.device,
    ) -> None:
        """`dp` is None when every DP rank holds whole parameters (stage 0); the norms travel
        on `comm_device` (the GPU under NCCL, even when the state is offloaded to the CPU)."""
        super().__init__(groups, defaults)
        self.pieces, self.num_segments, self.tp, self.dp = pieces, num_segments, tp, dp
        self.comm_device = comm_device

    def slots(self, p: Tensor) -> dict[str, Tensor]:
        """This view's state, created at step 0 with zero slots."""
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            for name in self.SLOTS:
                state[name] = torch.zeros_like(p)
        return state

    def segment_norms(self, tensors: dict[Tensor, tuple[Tensor, ...]]) -> Tensor:
        """[num_segments, k] float64 CPU: the L2 norm of each logical parameter's part of each of
        the k tensors given per view (a TP-replicated parameter counted once)."""
        k = len(next(iter(tensors.values())))
        device = next(iter(tensors)).device
        sums = torch.zeros(self.num_segments, k, dtype=torch.float64, device=device)
        for p, values in tensors.items():
            for sid, a, b, sharded in self.pieces[p]:
                if sharded or self.tp.rank == 0:
                    for j, value in enumerate(values):
                        sums[sid, j] += value[a:b].double().square().sum()
        sums = sums.to(self.comm_device)
        if self.dp is not None:
            all_reduce(sums, self.dp)
        all_reduce(sums, self.tp)
        return sums.cpu().sqrt()

    def per_segment(self, p: Tensor) -> list[tuple[int, int, int]]:
        """(segment id, start, stop) of the logical parameters inside view p."""
        return [(sid, a, b) for sid, a, b, _ in self.pieces[p]]

    def stepped(self) -> list[tuple[dict, Tensor, Tensor]]:
        """(group, view, gradient) of every view with a gradient this step."""
        return [
            (g, p, p.grad) for g in self.param_groups for p in g["params"] if p.grad is not None
        ]


def trust_ratios(numerator: Tensor, denominator: Tensor) -> list[float]:
    """numerator / denominator per segment, 1 where either is 0 (a zero weight or update)."""
    ok = (numerator > 0) & (denominator > 0)
    return torch.where(
        ok, numerator / denominator.clamp(min=1e-300), torch.ones_like(numerator)
    ).tolist()


class FlatLamb(FlatLayerwise):
    """LAMB (You et al., 2020): per element AdamW's moments and update u = m_hat /
    (sqrt(v_hat) + eps) (+ weight_decay x w on decayed parameters); each logical parameter moves
    by lr x (||w|| / ||u||) x u."""

    SLOTS = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        groups: list[dict],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        **layout: Any,
    ) -> None:
        super().__init__(
            groups, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0}, **layout
        )

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        updates: dict[Tensor, tuple[Tensor, ...]] = {}
        for group, p, grad in self.stepped():
            beta1, beta2 = group["betas"]
            state = self.slots(p)
            state["step"] += 1
            t = float(state["step"])
            state["exp_avg"].lerp_(grad, 1 - beta1)
            state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (state["exp_avg_sq"] / (1 - beta2**t)).sqrt_().add_(group["eps"])
            update = state["exp_avg"] / (1 - beta1**t) / denom
            if group["weight_decay"]:
                update.add_(p, alpha=group["weight_decay"])
            updates[p] = (p, update)
        if not updates:
            return
        norms = self.segment_norms(updates)
        ratio = trust_ratios(norms[:, 0], norms[:, 1])
        for group, p, _ in self.stepped():
            for sid, a, b in self.per_segment(p):
                p[a:b].add_(updates[p][1][a:b], alpha=-group["lr"] * ratio[sid])


class FlatLars(FlatLayerwise):
    """LARS (You et al., 2017): SGD with heavy-ball momentum whose step for each logical
    parameter is scaled by the trust ratio eta x ||w|| / (||g|| + wd x ||w||):
    v = momentum x v + lr x ratio x (g + wd x w); w -= v. Biases and LayerNorms (the group that
    is not `decayed`) take the plain momentum step, without decay, as is customary."""

    SLOTS = ("momentum_buffer",)

    def __init__(
        self, groups: list[dict], *, lr: float, momentum: float, eta: float, **layout: Any
    ) -> None:
        super().__init__(
            groups,
            {"lr": lr, "momentum": momentum, "eta": eta, "weight_decay": 0.0, "decayed": False},
            **layout,
        )

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        stepped = self.stepped()
        if not stepped:
            return
        norms = self.segment_norms({p: (p, grad) for _, p, grad in stepped})
        for group, p, grad in stepped:
            state = self.slots(p)
            state["step"] += 1
            wd, lr = group["weight_decay"], group["lr"]
            direction = grad.add(p, alpha=wd) if wd else grad.clone()
            if group["decayed"]:
                w_norm, g_norm = norms[:, 0], norms[:, 1]
                ratio = trust_ratios(group["eta"] * w_norm, g_norm + wd * w_norm)
                for sid, a, b in self.per_segment(p):
                    direction[a:b].mul_(lr * ratio[sid])
            else:
                direction.mul_(lr)
            state["momentum_buffer"].mul_(group["momentum"]).add_(direction)
            p.sub_(state["momentum_buffer"])


class FlatNovoGrad(FlatLayerwise):
    """NovoGrad (Ginsburg et al., 2019): a second moment per layer (logical parameter) of the
    gradient norm, v = beta2 x v + (1 - beta2) x ||g||^2 (v = ||g||^2 at the first step); per
    element m = beta1 x m + (g / (sqrt(v) + eps) + wd x w); w -= lr x m (decoupled decay on
    decayed parameters only). v is stored expanded over its parameter's elements."""

    SLOTS = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        groups: list[dict],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        **layout: Any,
    ) -> None:
        super().__init__(
            groups, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0}, **layout
        )

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        stepped = self.stepped()
        if not stepped:
            return
        g_norm = self.segment_norms({p: (grad,) for _, p, grad in stepped})[:, 0]
        for group, p, grad in stepped:
            beta1, beta2 = group["betas"]
            state = self.slots(p)
            first = int(state["step"]) == 0
            state["step"] += 1
            scaled = grad.clone()
            for sid, a, b in self.per_segment(p):
                square = float(g_norm[sid]) ** 2
                v = (
                    square
                    if first
                    else beta2 * float(state["exp_avg_sq"][a]) + (1 - beta2) * square
                )
                state["exp_avg_sq"][a:b].fill_(v)
                scaled[a:b].div_(v**0.5 + group["eps"])
            if group["weight_decay"]:
                scaled.add_(p, alpha=group["weight_decay"])
            state["exp_avg"].mul_(beta1).add_(scaled)
            p.add_(state["exp_avg"], alpha=-group["lr"])
