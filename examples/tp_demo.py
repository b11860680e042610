"""A tensor-parallel toy language model trained on 2 ranks, checked against the one-process model.

    torchrun --nproc_per_node 2 examples/tp_demo.py

Embedding (vocab-parallel) -> column -> GELU -> row -> tied vocab-parallel logits -> sharded
cross-entropy, trained with SGD to copy the next token of a fixed random sequence. Rank 0
prints the TP loss next to the loss of the same model run unsharded in rank 0's process.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tpformer.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)
from tpformer.parallel import GroupHandle, ParallelContext
from tpformer.parallel.comm import copy_to_tp
from tpformer.parallel.init import initialize_parameters

VOCAB, HIDDEN, STEPS = 64, 32, 30


class ToyLM(nn.Module):
    def __init__(self, tp: GroupHandle) -> None:
        super().__init__()
        self.tp = tp
        self.embed = VocabParallelEmbedding(VOCAB, HIDDEN, tp)
        self.up = ColumnParallelLinear(HIDDEN, 4 * HIDDEN, tp)
        self.down = RowParallelLinear(4 * HIDDEN, HIDDEN, tp)

    def forward(self, ids: Tensor, target: Tensor) -> Tensor:
        h = self.embed(ids)
        h = h + self.down(F.gelu(self.up(h)))
        logits = F.linear(copy_to_tp(h, self.tp), self.embed.weight)  # [n, V/tp], never gathered
        return vocab_parallel_cross_entropy(logits, target, self.tp, vocab_size=VOCAB).mean()


def train(ctx: ParallelContext) -> list[float]:
    model = ToyLM(ctx.tp)
    initialize_parameters(model, ctx.rng, ctx.tp, std=0.2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ids = torch.randint(0, VOCAB, (256,), generator=torch.Generator().manual_seed(0))
    losses = []
    for _ in range(STEPS):
        loss = model(ids[:-1], ids[1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main() -> None:
    ctx = ParallelContext.create(tensor=2, seed=0)
    tp_losses = train(ctx)
    if ctx.is_main:
        single = train(ParallelContext.single(seed=0, device="cpu"))
        print(f"layout: world={ctx.layout.world_size} = dp {ctx.layout.dp} x tp {ctx.layout.tp}")
        print("step  loss(tp=2)  loss(tp=1)")
        for step in range(0, STEPS, 5):
            print(f"{step:4d}  {tp_losses[step]:10.6f}  {single[step]:10.6f}")
        worst = max(abs(a - b) / b for a, b in zip(tp_losses, single))
        print(f"max relative difference tp=2 vs tp=1 over {STEPS} steps: {worst:.2e}")
    ctx.destroy()


if __name__ == "__main__":
    main()
