"""Layer-wise optimizers on the engine's flat master views: LAMB, LARS and NovoGrad.

Each scales or normalizes a *logical* parameter's step by norms of that whole parameter (its
weights, gradient or Adam update). A parameter's pieces are spread over the flat views of this
rank, over the DP shards (ZeRO stages 1-3) and, when TP-sharded, over the TP ranks, so the
norms are summed per parameter over all of them -- one all-reduce of a [segments, k] tensor
over DP and one over TP per step -- and the step equals the per-parameter single-process
optimizer at any layout. Per-element state lives under names the engine's logical state saves
and reshards (`SLOTS`); NovoGrad's per-layer second moment is kept expanded to its elements so
it reshards like the rest.

Nothing is read on the host: the norms, trust ratios and bias corrections stay device tensors,
and a step the engine marks non-finite (`found_inf`, as fused AdamW takes it) leaves weights,
slots and the step count unchanged by device selects. (With the state offloaded to the CPU,
the norms computed on the accelerator are copied to it: the CPU step waits for them, as it
waits for the gradients.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from tpformer.parallel.comm import all_reduce
from tpformer.parallel.handle import GroupHandle

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
        self.found_inf: Tensor | None = None
        """Set by the engine before `step`: 1.0 skips the step (on the device)."""

    def taken(self, device: torch.device) -> Tensor:
        """bool device scalar: whether this step updates anything (not `found_inf`)."""
        if self.found_inf is None:
            return torch.ones((), dtype=torch.bool, device=device)
        return self.found_inf.to(device) == 0

    def slots(self, p: Tensor) -> dict[str, Tensor]:
        """This view's state, created at step 0 with zero slots."""
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            for name in self.SLOTS:
                state[name] = torch.zeros_like(p)
        return state

    def segment_norms(self, tensors: dict[Tensor, tuple[Tensor, ...]]) -> Tensor:
        """[num_segments, k] float64 on the state's device: the L2 norm of each logical
        parameter's part of each of the k tensors given per view (a TP-replicated parameter
        counted once)."""
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
        return sums.sqrt().to(device)

    def per_segment(self, p: Tensor) -> list[tuple[int, int, int]]:
        """(segment id, start, stop) of the logical parameters inside view p."""
        return [(sid, a, b) for sid, a, b, _ in self.pieces[p]]

    def stepped(self) -> list[tuple[dict, Tensor, Tensor]]:
        """(group, view, gradient) of every view with a gradient this step."""
        return [
            (g, p, p.grad) for g in self.param_groups for p in g["params"] if p.grad is not None
        ]


def trust_ratios(numerator: Tensor, denominator: Tensor) -> Tensor:
    """numerator / denominator per segment, 1 where either is 0 (a zero weight or update)."""
    ok = (numerator > 0) & (denominator > 0)
    return torch.where(ok, numerator / denominator.clamp(min=1e-300), torch.ones_like(numerator))


def bias_correction(beta: float, step: Tensor) -> Tensor:
    """1 - beta^step, computed in float64 and rounded once, as from a host number."""
    return (1 - beta ** step.double()).float()


def kept(old: Tensor, new: Tensor, taken: Tensor) -> None:
    """old <- new where the step is taken (a device select)."""
    old.copy_(torch.where(taken, new, old))


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
        taken = None
        for group, p, grad in self.stepped():
            beta1, beta2 = group["betas"]
            taken = self.taken(p.device) if taken is None else taken
            state = self.slots(p)
            state["step"] += taken
            m, v = state["exp_avg"], state["exp_avg_sq"]
            kept(m, m.lerp(grad, 1 - beta1), taken)
            kept(v, v.mul(beta2).addcmul_(grad, grad, value=1 - beta2), taken)
            denom = (v / bias_correction(beta2, state["step"])).sqrt_().add_(group["eps"])
            update = m / bias_correction(beta1, state["step"]) / denom
            if group["weight_decay"]:
                update.add_(p, alpha=group["weight_decay"])
            updates[p] = (p, update)
        if not updates or taken is None:
            return
        norms = self.segment_norms(updates)
        ratio = trust_ratios(norms[:, 0], norms[:, 1])
        step_size = torch.where(taken, ratio, 0.0)
        for group, p, _ in self.stepped():
            for sid, a, b in self.per_segment(p):
                p[a:b].addcmul_(updates[p][1][a:b], step_size[sid].to(p.dtype), value=-group["lr"])


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
        taken = self.taken(stepped[0][1].device)
        for group, p, grad in stepped:
            state = self.slots(p)
            state["step"] += taken
            wd, lr = group["weight_decay"], group["lr"]
            direction = grad.add(p, alpha=wd) if wd else grad.clone()
            if group["decayed"]:
                w_norm, g_norm = norms[:, 0], norms[:, 1]
                ratio = trust_ratios(group["eta"] * w_norm, g_norm + wd * w_norm)
                for sid, a, b in self.per_segment(p):
                    direction[a:b].mul_((lr * ratio[sid]).to(p.dtype))
            else:
                direction.mul_(lr)
            buffer = state["momentum_buffer"]
            kept(buffer, buffer.mul(group["momentum"]).add_(direction), taken)
            p.sub_(torch.where(taken, buffer, 0.0))


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
        taken = self.taken(stepped[0][1].device)
        for group, p, grad in stepped:
            beta1, beta2 = group["betas"]
            state = self.slots(p)
            first = state["step"] == 0
            state["step"] += taken
            scaled = grad.clone()
            v_all = state["exp_avg_sq"]
            for sid, a, b in self.per_segment(p):
                square = g_norm[sid] ** 2
                old = v_all[a].double()
                v = torch.where(first, square, beta2 * old + (1 - beta2) * square)
                v_all[a:b].fill_(torch.where(taken, v, old).to(v_all.dtype))
                scaled[a:b].div_((v.sqrt() + group["eps"]).to(scaled.dtype))
            if group["weight_decay"]:
                scaled.add_(p, alpha=group["weight_decay"])
            m = state["exp_avg"]
            kept(m, m.mul(beta1).add_(scaled), taken)
            p.sub_(torch.where(taken, m, 0.0), alpha=group["lr"])
