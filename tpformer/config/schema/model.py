"""The model group: architecture and sizes."""

from __future__ import annotations

from dataclasses import dataclass

from tpformer.config.schema.choices import Activation, Arch, ranged


@dataclass
class ModelConfig:
    """Architecture hyper-parameters; `model=<preset>` picks one of tpformer.config.presets."""

    arch: Arch = Arch.bert
    """bert (post-LayerNorm encoder) or gpt (pre-LayerNorm causal decoder)."""
    vocab_size: int = ranged(30522, 1)
    """Real vocabulary size; the embedding is padded to a multiple of pad_vocab_to * tp."""
    hidden_size: int = ranged(768, 1)
    """Must be divisible by num_heads."""
    num_layers: int = ranged(12, 1)
    """Transformer layers."""
    num_heads: int = ranged(12, 1)
    """parallel.tensor must divide it: each TP rank holds num_heads / tp whole heads."""
    intermediate_size: int = ranged(3072, 1)
    """FFN width; parallel.tensor must divide it."""
    max_position_embeddings: int = ranged(512, 1)
    """Longest sequence (learned position embeddings); data.seq_length must not exceed it."""
    type_vocab_size: int = ranged(2, 0)
    """Segment embeddings (BERT only)."""
    dropout: float = ranged(0.1, 0, 1, hi_open=True)
    """Dropout on embeddings and residual branches."""
    attention_dropout: float = ranged(0.1, 0, 1, hi_open=True)
    """Dropout on attention probabilities (one stream per global sample over all heads)."""
    activation: Activation = Activation.gelu
    """gelu (erf, BERT) or gelu_tanh (GPT-2's gelu_new)."""
    layer_norm_eps: float = ranged(1e-12, 0, lo_open=True)
    """LayerNorm epsilon (BERT 1e-12, GPT-2 1e-5)."""
    init_std: float = ranged(0.02, 0, lo_open=True)
    """Standard deviation of the normal init of weight matrices and embeddings."""
    pad_vocab_to: int = ranged(128, 0)
    """Pad the vocabulary to a multiple of this times tp (0: no padding, tp must divide vocab)."""
