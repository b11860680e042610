"""tpformer: Megatron-style tensor-parallel transformers on torch.distributed.

The Python API (tpformer/api.py) loads on first use, so `import tpformer` stays light:
`tpformer.compose_config`, `tpformer.pretrain`, `tpformer.finetune`, `tpformer.Callback`."""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

API = ("Callback", "Run", "compose_config", "finetune", "pretrain")


def __getattr__(name: str) -> Any:
    if name in API:
        from tpformer import api

        return getattr(api, name)
    raise AttributeError(f"module 'tpformer' has no attribute {name!r}")
