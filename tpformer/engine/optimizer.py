"""The fp32 master weights and the optimizer that steps them.

Each bucket has one master: the part of the bucket this rank updates (the whole bucket at stage
0, this rank's DP chunk at stages 1-3), fp32, on the CPU with offload. When the compute
parameters are fp32 on the same device, the master *is* their storage (aliased) and no copy
back is needed. The optimizer sees at most two views of each master, the weight-decayed part
and the rest (FlatBucket puts decayed parameters first), so AdamW decays inside its fused
kernel and the layer-wise optimizers (LAMB, LARS, NovoGrad) can find each logical parameter
inside its views.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tpformer.config.schema import OptimConfig
from tpformer.engine.flat_buffer import FlatBucket
from tpformer.engine.layerwise import FlatLamb, FlatLars, FlatNovoGrad, Piece
from tpformer.parallel.handle import GroupHandle


@dataclass
class OptimizerView:
    """A slice [start, stop) of a master, stepped as one optimizer parameter."""

    param: nn.Parameter
    start: int
    stop: int
    decay: bool


@dataclass
class Master:
    """One bucket's fp32 optimizer copy and its views."""

    values: Tensor
    views: list[OptimizerView]


def build_masters(
    buckets: list[FlatBucket],
    owned: list[Tensor],
    *,
    whole: bool,
    aliased: bool,
    device: torch.device,
) -> list[Master]:
    """fp32 masters from the owned parts of the buckets (aliased: the owned tensors themselves)."""
    masters = []
    for bucket, values in zip(buckets, owned):
        master = values if aliased else values.float().to(device, copy=True)
        split = bucket.decay_split(whole=whole)
        views = [
            OptimizerView(nn.Parameter(master[a:b], requires_grad=False), a, b, decay)
            for (a, b), decay in zip(split, (True, False))
            if b > a
        ]
        masters.append(Master(master, views))
    return masters


def _pieces(
    buckets: list[FlatBucket], masters: list[Master], *, whole: bool
) -> tuple[dict[Tensor, list[Piece]], int]:
    """Where each logical parameter lies inside this rank's optimizer views, by segment id
    (ids are the same on every rank, so per-parameter norms can be all-reduced)."""
    pieces: dict[Tensor, list[Piece]] = {}
    first = 0
    for bucket, master in zip(buckets, masters):
        ranges = (
            [(seg, seg.offset, seg.offset + seg.numel) for seg in bucket.segments]
            if whole
            else bucket.shard_ranges()
        )
        ids = {id(seg): first + i for i, seg in enumerate(bucket.segments)}
        for view in master.views:
            lo, hi = view.start, view.stop
            pieces[view.param] = [
                (ids[id(seg)], max(a, lo) - lo, min(b, hi) - lo, seg.tp_sharded)
                for seg, a, b in ranges
                if max(a, lo) < min(b, hi)
            ]
        first += len(bucket.segments)
    return pieces, first


def build_optimizer(
    optim: OptimConfig,
    buckets: list[FlatBucket],
    masters: list[Master],
    *,
    whole: bool,
    tp: GroupHandle,
    dp: GroupHandle,
    comm_device: torch.device,
) -> torch.optim.Optimizer:
    """AdamW (fused where the state's device has it), LAMB, LARS or NovoGrad over the masters'
    views; biases and LayerNorms (the non-decayed views) get no weight decay (and, under LARS,
    no trust ratio)."""
    views = [v for m in masters for v in m.views]
    groups = [
        {
            "params": [v.param for v in views if v.decay == decay],
            "weight_decay": optim.weight_decay if decay else 0.0,
            "decayed": decay,
        }
        for decay in (True, False)
    ]
    groups = [g for g in groups if g["params"]]
    betas = (optim.beta1, optim.beta2)
    if optim.name in ("lamb", "lars", "novograd"):
        pieces, num_segments = _pieces(buckets, masters, whole=whole)
        layout = {
            "pieces": pieces,
            "num_segments": num_segments,
            "tp": tp,
            "dp": None if whole else dp,
            "comm_device": comm_device,
        }
        if optim.name == "lars":
            return FlatLars(
                groups, lr=optim.lr, momentum=optim.momentum, eta=optim.trust_coefficient, **layout
            )
        kind = FlatLamb if optim.name == "lamb" else FlatNovoGrad
        return kind(groups, lr=optim.lr, betas=betas, eps=optim.eps, **layout)
    state_device = masters[0].values.device
    if state_device.type in ("cpu", "cuda"):
        return torch.optim.AdamW(groups, lr=optim.lr, betas=betas, eps=optim.eps, fused=True)
    return DeviceAdamW(groups, lr=optim.lr, betas=betas, eps=optim.eps)


class DeviceAdamW(torch.optim.Optimizer):
    """AdamW (decoupled decay, bias corrections, as torch's) in plain tensor ops with its step
    count on the device and `found_inf` taken as the fused kernel takes it (1.0 skips the step,
    by device selects): for devices without PyTorch's fused AdamW, such as the meta device of
    a dry run, where torch's other AdamW kernels read the step count on the host."""

    def __init__(
        self, groups: list[dict], *, lr: float, betas: tuple[float, float], eps: float
    ) -> None:
        super().__init__(groups, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0})
        self.found_inf: Tensor | None = None

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                taken = torch.ones((), dtype=torch.bool, device=p.device)
                if self.found_inf is not None:
                    taken = self.found_inf.to(p.device) == 0
                state = optimizer_slots(self, p)
                state["step"] += taken
                step = state["step"].double()
                m = state["exp_avg"].lerp(p.grad, 1 - beta1)
                v = state["exp_avg_sq"].mul(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (v.sqrt() / (1 - beta2**step).sqrt().float()).add_(eps)
                step_size = (lr / (1 - beta1**step)).float()
                new = p.mul(1 - lr * wd).sub_(m / denom * step_size)
                for old, value in ((p, new), (state["exp_avg"], m), (state["exp_avg_sq"], v)):
                    old.copy_(torch.where(taken, value, old))


def moments(optimizer: torch.optim.Optimizer) -> tuple[str, ...]:
    """The per-element state of the optimizer: AdamW's moments, or a layer-wise one's SLOTS."""
    return getattr(optimizer, "SLOTS", ("exp_avg", "exp_avg_sq"))


def optimizer_slots(optimizer: torch.optim.Optimizer, param: Tensor) -> dict[str, Tensor]:
    """The optimizer's state of one view, created as a fresh optimizer would have it (zero
    moments, step 0) when it has not stepped yet, so it can be saved or loaded into."""
    state = optimizer.state[param]
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
        for name in moments(optimizer):
            state[name] = torch.zeros_like(param)
    return state
