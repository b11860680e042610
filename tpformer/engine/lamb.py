"""LAMB (You et al., 2020) on the engine's flat master views, for large-batch BERT pretraining.

Per element it keeps AdamW's moments and forms the Adam update u = m_hat / (sqrt(v_hat) + eps)
(+ weight_decay x w on decayed parameters); each *logical* parameter then moves by
lr x (||w|| / ||u||) x u. A parameter's pieces are spread over the flat views of this rank, over
the DP shards (ZeRO stages 1-3) and, when TP-sharded, over the TP ranks, so the two norms are
summed per parameter over all of them -- one all-reduce of a [segments, 2] tensor per group --
and the step equals the single-process LAMB at any layout. The state has AdamW's names
(step, exp_avg, exp_avg_sq), so checkpoints and resharding treat both alike.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tpformer.parallel.comm import all_reduce
from tpformer.parallel.context import GroupHandle

Piece = tuple[int, int, int, bool]
"""(segment id, start, stop, TP-sharded) of one logical parameter inside a flat view."""


class FlatLamb(torch.optim.Optimizer):
    def __init__(self, groups: list[dict], *, pieces: dict[Tensor, list[Piece]], num_segments: int,
                 tp: GroupHandle, dp: GroupHandle | None, comm_device: torch.device, lr: float,
                 betas: tuple[float, float], eps: float) -> None:
        """`dp` is None when every DP rank holds whole parameters (stage 0); the norms travel
        on `comm_device` (the GPU under NCCL, even when the state is offloaded to the CPU)."""
        super().__init__(groups, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": 0.0})
        self.pieces, self.num_segments, self.tp, self.dp = pieces, num_segments, tp, dp
        self.comm_device = comm_device

    def _slots(self, p: Tensor) -> dict[str, Tensor]:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        return state

    @torch.no_grad()
    def step(self, closure: None = None) -> None:  # type: ignore[override]
        device = next(p.device for g in self.param_groups for p in g["params"])
        sums = torch.zeros(self.num_segments, 2, dtype=torch.float64, device=device)
        updates: dict[Tensor, Tensor] = {}
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._slots(p)
                state["step"] += 1
                t = float(state["step"])
                state["exp_avg"].lerp_(p.grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                denom = (state["exp_avg_sq"] / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
                update = state["exp_avg"] / (1 - beta1 ** t) / denom
                if group["weight_decay"]:
                    update.add_(p, alpha=group["weight_decay"])
                updates[p] = update
                for sid, a, b, sharded in self.pieces[p]:
                    if sharded or self.tp.rank == 0:  # a TP-replicated parameter counts once
                        sums[sid, 0] += p[a:b].double().square().sum()
                        sums[sid, 1] += update[a:b].double().square().sum()
        sums = sums.to(self.comm_device)
        if self.dp is not None:
            all_reduce(sums, self.dp)
        all_reduce(sums, self.tp)
        norms = sums.cpu().sqrt()
        ratio = torch.where((norms[:, 0] > 0) & (norms[:, 1] > 0), norms[:, 0] / norms[:, 1],
                            torch.ones_like(norms[:, 0])).tolist()
        for group in self.param_groups:
            for p in group["params"]:
                if p in updates:
                    for sid, a, b, _ in self.pieces[p]:
                        p[a:b].add_(updates[p][a:b], alpha=-group["lr"] * ratio[sid])
