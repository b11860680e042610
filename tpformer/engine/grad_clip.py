"""Global gradient norm over TP, DP and pipeline stages, counting TP-replicated parameters and
pipeline-tied ones once."""

from __future__ import annotations

import torch
from torch import Tensor

from tpformer.engine.flat_buffer import FlatBucket
from tpformer.parallel.comm import all_reduce
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.param_info import param_info


def global_grad_norm(
    buckets: list[FlatBucket],
    shard_grads: list[Tensor],
    tp: GroupHandle,
    dp: GroupHandle,
    pp: GroupHandle | None = None,
) -> Tensor:
    """L2 norm of the full gradient, from each rank's DP shard of each bucket: a float64 scalar
    on the gradients' device (inf/nan when a gradient is), never read on the host here.

    Each DP rank sums squares over its own shard (so DP ranks never double count); TP-sharded
    segments count on every TP rank, replicated ones only on TP rank 0; each stage counts its
    own parameters, the tied word embedding on the first stage only.
    """
    counted = [
        grad[a:b]
        for bucket, grad in zip(buckets, shard_grads)
        for seg, a, b in bucket.shard_ranges()
        if (seg.tp_sharded or tp.rank == 0) and param_info(seg.param).counted_in_norm
    ]
    total = torch.zeros((), dtype=torch.float64, device=shard_grads[0].device)
    if counted:  # one fused call over every piece, each norm in the gradients' dtype
        total = torch.stack(torch._foreach_norm(counted)).double().square().sum()
    total = total.reshape(1)
    all_reduce(total, dp)
    all_reduce(total, tp)
    if pp is not None:
        all_reduce(total, pp)
    return total.reshape(()).sqrt()
