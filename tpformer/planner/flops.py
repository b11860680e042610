"""The one FLOP count of a layer, the output head and a training step: what the loop's MFU,
the planner's step time and the pipeline's balanced split all use."""

from __future__ import annotations

from tpformer.config.schema import ModelConfig


def flops_per_step(config: ModelConfig, *, samples: int, seq: int, head_tokens: float) -> float:
    """Model FLOPs of one training step (forward + backward = 3x forward), as executed: the
    layers' matmuls and attention over every token, the vocabulary head over `head_tokens`
    (the MFU the loop reports and the planner predicts; recomputation not counted)."""
    h = config.hidden_size
    per_token = config.num_layers * layer_flops_per_token(h, config.intermediate_size, seq)
    return 3.0 * (
        samples * seq * per_token + head_tokens * head_flops_per_token(h, config.vocab_size)
    )


def layer_flops_per_token(hidden: int, intermediate: int, seq: int) -> int:
    """Forward FLOPs of one transformer layer per token: the QKV, output and two MLP matmuls,
    and attention's QK^T and PV over `seq` keys."""
    return 2 * (4 * hidden * hidden + 2 * hidden * intermediate) + 4 * seq * hidden


def head_flops_per_token(hidden: int, vocab: int) -> int:
    """Forward FLOPs of the output head per token it runs on: the transform and the vocabulary
    projection."""
    return 2 * (hidden * hidden + hidden * vocab)
