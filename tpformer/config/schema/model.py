"""The model group: architecture and sizes."""

from __future__ import annotations

from dataclasses import dataclass

from tpformer.config.schema.choices import (
    Activation,
    Arch,
    ClassifierPooling,
    Norm,
    Pooler,
    PositionEmbedding,
    RopeScaling,
    ranged,
)


@dataclass
class ModelConfig:
    """Architecture hyper-parameters; `model=<preset>` picks one of tpformer.config.presets."""

    arch: Arch = Arch.bert
    """bert (encoder: BERT, and with the keys below ModernBERT) or gpt (pre-norm causal
    decoder: GPT-2, and with the keys below the Llama family)."""
    vocab_size: int = ranged(30522, 1)
    """Real vocabulary size; the embedding is padded to a multiple of pad_vocab_to * tp."""
    hidden_size: int = ranged(768, 1)
    """Must be divisible by num_heads."""
    num_layers: int = ranged(12, 1)
    """Transformer layers."""
    num_heads: int = ranged(12, 1)
    """parallel.tensor must divide it: each TP rank holds num_heads / tp whole heads."""
    num_kv_heads: int = ranged(0, 0)
    """Key/value heads (grouped-query attention; 1: multi-query); 0: num_heads. It divides
    num_heads, and parallel.tensor divides it: each TP rank holds whole groups."""
    intermediate_size: int = ranged(3072, 1)
    """FFN width; parallel.tensor must divide it."""
    max_position_embeddings: int = ranged(512, 1)
    """Longest sequence (learned position embeddings, or the context of rope);
    data.seq_length must not exceed it."""
    type_vocab_size: int = ranged(2, 0)
    """Segment embeddings (BERT only)."""
    dropout: float = ranged(0.1, 0, 1, hi_open=True)
    """Dropout on embeddings and residual branches."""
    attention_dropout: float = ranged(0.1, 0, 1, hi_open=True)
    """Dropout on attention probabilities (one stream per global sample over all heads)."""
    activation: Activation = Activation.gelu
    """gelu (erf, BERT), gelu_tanh (GPT-2's gelu_new) or silu (Llama's SwiGLU, gated)."""
    gated_mlp: bool = False
    """The MLP's activation gates a second projection (SwiGLU with silu, GeGLU with gelu):
    act(x W_gate) * (x W_up), a column of each on the same TP rank."""
    norm: Norm = Norm.layernorm
    """layernorm or rmsnorm (Llama)."""
    pre_norm: bool = False
    """bert: pre-norm layers (ModernBERT): the embeddings normalized, the first layer's
    attention norm skipped, a final norm after the last layer; false: BERT's post-norm. gpt is
    pre-norm always."""
    layer_norm_eps: float = ranged(1e-12, 0, lo_open=True)
    """LayerNorm / RMSNorm epsilon (BERT 1e-12, GPT-2 1e-5, Llama 1e-5 or 1e-6)."""
    bias: bool = True
    """Biases of the projections and LayerNorms (Llama: none)."""
    qkv_bias: bool = False
    """The query/key/value projection has a bias even with bias=false (Qwen2)."""
    tie_embeddings: bool = True
    """gpt: the LM head is the word embedding (GPT-2); false: a weight of its own (Llama)."""
    position_embedding: PositionEmbedding = PositionEmbedding.learned
    """learned (a table of max_position_embeddings rows) or rope (rotary, applied to queries
    and keys by their position in the whole sequence)."""
    rope_theta: float = ranged(10000.0, 0, lo_open=True)
    """RoPE base (Llama 2: 10,000; Llama 3: 500,000)."""
    rope_scaling: RopeScaling = RopeScaling.none
    """none, linear (positions / rope_factor), dynamic (NTK: the base grows past
    rope_original_max_positions) or llama3 (Llama 3.1's per-frequency smoothing)."""
    rope_factor: float = ranged(1.0, 0, lo_open=True)
    """The scaling factor of rope_scaling."""
    rope_original_max_positions: int = ranged(0, 0)
    """dynamic and llama3: the context the model was trained at (0: max_position_embeddings)."""
    rope_low_freq_factor: float = ranged(1.0, 0, lo_open=True)
    """llama3: wavelengths above rope_original_max_positions / this are scaled whole."""
    rope_high_freq_factor: float = ranged(4.0, 0, lo_open=True)
    """llama3: wavelengths below rope_original_max_positions / this are kept."""
    local_window: int = ranged(0, 0)
    """Sliding-window (local) attention: a token attends to the keys at most local_window / 2
    positions away (ModernBERT's local_attention, 128); 0: every layer attends globally."""
    global_every: int = ranged(1, 1)
    """With local_window: layers 0, n, 2n, ... attend globally, the others locally
    (ModernBERT: 3)."""
    local_rope_theta: float = ranged(10000.0, 0, lo_open=True)
    """The RoPE base of local layers (ModernBERT: 10,000; its global layers' is rope_theta,
    160,000)."""
    pooler: Pooler = Pooler.tanh
    """bert: tanh (BERT: dense + tanh on the first token, feeding the NSP/SOP head and the
    classifier) or head (ModernBERT: no pair head, pretraining is MLM only with
    data.sentence_pairs=none; the classifier reads dense + activation + norm of the pooled
    sequence)."""
    classifier_pooling: ClassifierPooling = ClassifierPooling.cls
    """pooler=head: what the classifier pools, the first token (cls) or the mean over the
    tokens (mean)."""
    init_std: float = ranged(0.02, 0, lo_open=True)
    """Standard deviation of the normal init of weight matrices and embeddings."""
    pad_vocab_to: int = ranged(128, 0)
    """Pad the vocabulary to a multiple of this times tp (0: no padding, tp must divide vocab)."""

    @property
    def kv_heads(self) -> int:
        """Key/value heads: num_kv_heads, or num_heads when it is 0."""
        return self.num_kv_heads or self.num_heads

    def is_local(self, layer: int) -> bool:
        """Whether `layer` attends in a sliding window (local_window, global_every)."""
        return self.local_window > 0 and layer % self.global_every != 0
