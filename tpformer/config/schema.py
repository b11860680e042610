"""Typed schema of the Hydra groups. YAML holds values; these dataclasses hold types and defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ParallelConfig:
    """How the world is split and how randomness is keyed."""

    tensor: int = 1
    """TP degree: must divide the attention heads, hidden size and world size."""
    data: str = "auto"
    """DP degree, or "auto" = world_size / tensor."""
    seed: int = 1234
    """Seeds weight init and every dropout mask; masks do not depend on the layout."""


@dataclass
class ModelConfig:
    """Architecture hyper-parameters; presets live in conf/model and tpformer.config.presets."""

    arch: str = "bert"
    """bert (post-LayerNorm encoder) or gpt (pre-LayerNorm causal decoder)."""
    vocab_size: int = 30522
    """Real vocabulary size; the embedding is padded to a multiple of pad_vocab_to * tp."""
    hidden_size: int = 768
    """Must be divisible by num_heads."""
    num_layers: int = 12
    num_heads: int = 12
    """parallel.tensor must divide it: each TP rank holds num_heads / tp whole heads."""
    intermediate_size: int = 3072
    """FFN width; parallel.tensor must divide it."""
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    """Segment embeddings (BERT only)."""
    dropout: float = 0.1
    """Dropout on embeddings and residual branches."""
    attention_dropout: float = 0.1
    """Dropout on attention probabilities (drawn per global head)."""
    activation: str = "gelu"
    """gelu (erf, BERT) or gelu_tanh (GPT-2's gelu_new)."""
    layer_norm_eps: float = 1e-12
    init_std: float = 0.02
    pad_vocab_to: int = 128
    """Pad the vocabulary to a multiple of this times tp (0: no padding, tp must divide vocab)."""
