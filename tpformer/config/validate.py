"""Cross-field checks that run before any collective, each naming the value and what is valid."""

from __future__ import annotations

from tpformer.config.schema import ModelConfig
from tpformer.parallel.layout import divisors

ARCHS = ("bert", "gpt")
ACTIVATIONS = ("gelu", "gelu_tanh")


def validate_model(model: ModelConfig, tp: int) -> None:
    """Raise ValueError if `model` cannot be built or cannot be split over `tp` ranks."""
    if model.arch not in ARCHS:
        raise ValueError(f"model.arch={model.arch!r} is not one of {list(ARCHS)}")
    if model.activation not in ACTIVATIONS:
        raise ValueError(f"model.activation={model.activation!r} is not one of {list(ACTIVATIONS)}")
    if model.hidden_size % model.num_heads != 0:
        raise ValueError(
            f"model.hidden_size={model.hidden_size} is not divisible by "
            f"model.num_heads={model.num_heads}; valid head counts are {divisors(model.hidden_size)}"
        )
    if model.num_heads % tp != 0:
        raise ValueError(
            f"parallel.tensor={tp} must divide model.num_heads={model.num_heads} "
            f"(valid: {divisors(model.num_heads)})"
        )
    if model.intermediate_size % tp != 0:
        raise ValueError(
            f"parallel.tensor={tp} must divide model.intermediate_size={model.intermediate_size}"
        )
    for name in ("dropout", "attention_dropout"):
        p = getattr(model, name)
        if not 0.0 <= p < 1.0:
            raise ValueError(f"model.{name}={p} must be in [0, 1)")
