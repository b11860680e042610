"""The only package that creates, stores or names process groups."""

from tpformer.parallel.context import GroupHandle, ParallelContext
from tpformer.parallel.layout import Layout, divide, resolve_layout, shard_range

__all__ = ["GroupHandle", "Layout", "ParallelContext", "divide", "resolve_layout", "shard_range"]
