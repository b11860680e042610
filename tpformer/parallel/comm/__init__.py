"""Collectives behind GroupHandles, one module per concern; the package is where tpformer calls
torch.distributed's communication (with parallel/context.py, which creates the groups, and the
pipeline and control modules of parallel/, which call these).

Each public function takes a GroupHandle and returns its input untouched when the group has
size 1, so the single-process model runs the same code. Every collective issued is reported to
the counters opened with `count_collectives()`, which the tests use to assert the exact
communication of a layer or model, in calls and in bytes.

record     counting, the hang report's recorder, the wait clock, `traced()` (inside compiled
           graphs the collectives are functional collectives)
tp         TP regions: copy_to_tp / reduce_from_tp (one all-reduce each way), scatter / gather of
           the last dim, plain all-reduce and all-gather for statistics, the first rank's tensor
sequence   sequence parallelism along dim 1 of [batch, seq, hidden]
flat       the DP/ZeRO engine's asynchronous flat-buffer collectives
shortcuts  gloo's CPU-only shortcuts (parallel.gloo_shortcuts)
objects    picklable objects across ranks
p2p        pipeline sends and receives, ring attention's ring
"""

from torch.distributed import ProcessGroup, ReduceOp

from tpformer.parallel.comm.flat import (
    all_gather_async,
    all_reduce_async,
    reduce_scatter_async,
    wait,
)
from tpformer.parallel.comm.objects import all_gather_object, broadcast_object
from tpformer.parallel.comm.p2p import recv, ring_shift_async, send_async
from tpformer.parallel.comm.record import (
    CollectiveCounts,
    Pending,
    count_collectives,
    process_group,
    traced,
)
from tpformer.parallel.comm.sequence import (
    SEQUENCE_DIM,
    SequenceGather,
    SequenceReduceScatter,
    reduce_scatter_sequence,
    sequence_range,
)
from tpformer.parallel.comm.shortcuts import PAIR_SWAP_MAX_BYTES
from tpformer.parallel.comm.tp import (
    all_gather_dim,
    all_reduce,
    all_reduce_coalesced,
    copy_to_tp,
    from_first_rank,
    gather_from_tp,
    reduce_from_tp,
    scatter_to_tp,
    summed,
)

__all__ = [
    "PAIR_SWAP_MAX_BYTES",
    "SEQUENCE_DIM",
    "CollectiveCounts",
    "Pending",
    "ProcessGroup",
    "ReduceOp",
    "SequenceGather",
    "SequenceReduceScatter",
    "all_gather_async",
    "all_gather_dim",
    "all_gather_object",
    "all_reduce",
    "all_reduce_async",
    "all_reduce_coalesced",
    "broadcast_object",
    "copy_to_tp",
    "count_collectives",
    "from_first_rank",
    "gather_from_tp",
    "process_group",
    "recv",
    "reduce_from_tp",
    "reduce_scatter_async",
    "reduce_scatter_sequence",
    "ring_shift_async",
    "scatter_to_tp",
    "send_async",
    "sequence_range",
    "summed",
    "traced",
    "wait",
]
