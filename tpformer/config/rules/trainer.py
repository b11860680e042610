"""The rules of the trainer group that the schema's declarations cannot state."""

from __future__ import annotations

from collections.abc import Sequence


def validate_loggers(loggers: Sequence[str]) -> None:
    """A logger whose package is missing stops the run before it starts, not at the first log."""
    import importlib.util

    if "wandb" in loggers and importlib.util.find_spec("wandb") is None:
        raise ValueError(
            "trainer.loggers includes wandb, but the wandb package is not installed: "
            "pip install 'tpformer[wandb]' (or drop wandb from trainer.loggers)"
        )
