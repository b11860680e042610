"""tpformer: Megatron-style tensor-parallel transformers on torch.distributed."""

__version__ = "0.1.0"
