"""Layout-independent parameters: full tensors in, this rank's slice kept; slices in, full out.

A sharded parameter's record (parallel/param_info.py), set by the layer that owns it, names
the dim split across TP and the unpadded size of that dim (for the vocabulary). Everything else
is replicated. Initialization draws the *full logical* tensor from a generator seeded by (seed,
parameter name) and keeps this rank's slice, so a model built with seed S at TP=t holds exactly
the slices of the model built with seed S at TP=1.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor, nn

from tpformer.parallel.comm import all_gather_dim
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.param_info import InitMethod, param_info, update_param_info
from tpformer.parallel.random import RNGTracker


def mark_sharded(param: nn.Parameter, dim: int, logical_size: int) -> nn.Parameter:
    """Record that `param` is this rank's chunk of a tensor whose `dim` has `logical_size` rows."""
    update_param_info(param, tp_dim=dim, logical_size=logical_size)
    return param


def mark_sequence_parallel(*items: nn.Module | nn.Parameter) -> None:
    """Record that these parameters (or the modules' parameters) act on sequence-sharded
    activations (LayerNorms, biases, position embeddings under sequence parallelism): each TP
    rank's gradient covers its chunk of the sequence only, and the engine sums them over the TP
    group before the update."""
    for item in items:
        for param in [item] if isinstance(item, nn.Parameter) else item.parameters():
            update_param_info(param, sequence_parallel=True)


def set_init(param: nn.Parameter, method: InitMethod) -> nn.Parameter:
    """Override the default initialization (normal(0, std) for matrices, zeros for vectors)."""
    update_param_info(param, init=method)
    return param


def logical_shape(param: Tensor) -> torch.Size:
    """Shape of the full, unpadded tensor of which `param` is one TP chunk."""
    return param_info(param).logical_shape(param.shape)


def shard_full(full: Tensor, param: Tensor, tp: GroupHandle) -> Tensor:
    """This rank's chunk of `full` in the layout of `param` (zero padding past the logical size)."""
    dim = param_info(param).tp_dim
    if dim is None:
        return full
    expected = logical_shape(param)
    if full.shape != expected:
        raise ValueError(f"full tensor has shape {tuple(full.shape)}, expected {tuple(expected)}")
    chunk = param.shape[dim]
    padded = chunk * tp.size
    if padded > full.shape[dim]:
        pad_shape = list(full.shape)
        pad_shape[dim] = padded - full.shape[dim]
        full = torch.cat([full, full.new_zeros(pad_shape)], dim=dim)
    return full.narrow(dim, tp.rank * chunk, chunk)


def gather_full(param: Tensor, tp: GroupHandle, tensor: Tensor | None = None) -> Tensor:
    """The full logical tensor from every rank's chunk of `param` (or of `tensor`, laid out like
    param, e.g. its gradient): one all-gather for a sharded parameter, none for a replicated one."""
    local = (param if tensor is None else tensor).detach()
    info = param_info(param)
    if info.tp_dim is None or info.logical_size is None:
        return local
    full = all_gather_dim(local, tp, info.tp_dim)
    return full.narrow(info.tp_dim, 0, info.logical_size)


def normal_init(std: float) -> InitMethod:
    """normal(0, std) drawn from the parameter's own generator."""

    def init(t: Tensor, g: torch.Generator) -> None:
        t.normal_(0.0, std, generator=g)

    return init


def ones_init(t: Tensor, g: torch.Generator) -> None:
    t.fill_(1.0)


def zeros_init(t: Tensor, g: torch.Generator) -> None:
    t.zero_()


@torch.no_grad()
def initialize_parameters(
    module: nn.Module, rng: RNGTracker, tp: GroupHandle, *, std: float
) -> None:
    """Initialize every parameter layout-independently (see the module docstring).

    Defaults: LayerNorm and RMSNorm weight 1, LayerNorm bias 0, other vectors 0, matrices
    normal(0, std); a
    parameter's own `init` (set_init) wins.
    """
    norms = (nn.LayerNorm, nn.RMSNorm)
    layer_norm_weights = {id(m.weight) for m in module.modules() if isinstance(m, norms)}
    for name, param in module.named_parameters():
        if param.device.type == "meta":  # shapes only (a dry run): no values to set
            continue
        method = param_info(param).init
        if method is None:
            if id(param) in layer_norm_weights:
                method = ones_init
            elif param.dim() == 1:
                method = zeros_init
            else:
                method = normal_init(std)
        full = torch.empty(logical_shape(param), dtype=torch.float32)
        method(full, rng.init_generator(name))
        param.copy_(shard_full(full, param, tp))


@torch.no_grad()
def load_full_state_dict(module: nn.Module, state: Mapping[str, Tensor], tp: GroupHandle) -> None:
    """Load full (unsharded, unpadded) tensors; each parameter keeps its own TP slice.

    Raises a ValueError naming the missing and unexpected keys and any shape mismatch.
    """
    own = dict(module.named_parameters())
    buffers = {k: v for k, v in module.named_buffers() if k in state}
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own) - set(buffers))
    if missing or unexpected:
        raise ValueError(
            f"state dict does not match the model: missing keys {missing}, "
            f"unexpected keys {unexpected}"
        )
    mismatched = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(logical_shape(p))}"
        for k, p in own.items()
        if tuple(state[k].shape) != tuple(logical_shape(p))
    ]
    if mismatched:
        raise ValueError("shape mismatch: " + "; ".join(mismatched))
    for name, param in own.items():
        param.copy_(shard_full(state[name].to(param.dtype), param, tp))
    for name, buf in buffers.items():
        buf.copy_(state[name])


@torch.no_grad()
def full_state_dict(module: nn.Module, tp: GroupHandle) -> dict[str, Tensor]:
    """Full logical tensors of every parameter, identical on every TP rank (tied ones once)."""
    return {name: gather_full(param, tp).clone() for name, param in module.named_parameters()}
