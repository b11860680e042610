"""The model group: architecture and sizes."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpformer.config.schema.choices import (
    Activation,
    Arch,
    ClassifierPooling,
    Norm,
    NormPosition,
    Pooler,
    RopeScaling,
    ranged,
)


@dataclass
class MlpConfig:
    """The feed-forward block."""

    activation: Activation = Activation.gelu
    """gelu (erf, BERT), gelu_tanh (GPT-2's gelu_new) or silu (Llama's SwiGLU)."""
    gated: bool = False
    """The activation gates a second projection (SwiGLU with silu, GeGLU with gelu):
    act(x W_gate) * (x W_up), a column of each on the same TP rank."""

    @property
    def matrices(self) -> int:
        """Weight matrices of the block: input (gate and up when gated) and output."""
        return 3 if self.gated else 2


@dataclass
class NormConfig:
    """The normalization of every layer, the embeddings and the final hidden states."""

    kind: Norm = Norm.layernorm
    """layernorm or rmsnorm (Llama)."""
    eps: float = ranged(1e-12, 0, lo_open=True)
    """Epsilon (BERT 1e-12, GPT-2 1e-5, Llama 1e-5 or 1e-6)."""
    bias: bool = True
    """LayerNorm's bias (ModernBERT: none; RMSNorm has none)."""
    position: NormPosition = NormPosition.post
    """post: after each residual add (BERT); pre: before each branch (ModernBERT, and arch=gpt,
    which requires it): bert then normalizes the embeddings, skips the first layer's attention
    norm and adds a final norm after the last layer."""

    def params(self, hidden: int) -> int:
        """One norm's parameters: a weight, and a bias for a LayerNorm with one."""
        return 2 * hidden if self.kind == Norm.layernorm and self.bias else hidden


@dataclass
class RotaryConfig:
    """Rotary position embeddings; present only when the model uses them."""

    theta: float = ranged(10000.0, 0, lo_open=True)
    """The base (Llama 2: 10,000; Llama 3: 500,000; ModernBERT's global layers: 160,000)."""
    scaling: RopeScaling = RopeScaling.none
    """none, linear (positions / factor), dynamic (NTK: the base grows past
    original_max_positions) or llama3 (Llama 3.1's per-frequency smoothing)."""
    factor: float = ranged(1.0, 0, lo_open=True)
    """The scaling factor of `scaling`."""
    original_max_positions: int = ranged(0, 0)
    """dynamic and llama3: the context the model was trained at (0: max_position_embeddings)."""
    low_freq_factor: float = ranged(1.0, 0, lo_open=True)
    """llama3: wavelengths above original_max_positions / this are scaled whole."""
    high_freq_factor: float = ranged(4.0, 0, lo_open=True)
    """llama3: wavelengths below original_max_positions / this are kept."""
    local_theta: float = ranged(10000.0, 0, lo_open=True)
    """The base of the local_attention layers (ModernBERT: 10,000)."""

    def base(self, *, local: bool) -> float:
        """The base of a global layer, or of a local one."""
        return self.local_theta if local else self.theta


@dataclass
class LocalAttentionConfig:
    """Sliding-window attention (ModernBERT's local layers); present only when it is used."""

    window: int = ranged(128, 1)
    """A token attends to the keys at most window / 2 positions away (ModernBERT: 128)."""
    global_every: int = ranged(3, 2)
    """Layers 0, n, 2n, ... attend globally, the others locally (ModernBERT: 3)."""


@dataclass
class ModelConfig:
    """Architecture hyper-parameters; `model=<preset>` picks one of tpformer.config.presets."""

    arch: Arch = Arch.bert
    """bert (encoder: BERT, and with the groups below ModernBERT) or gpt (pre-norm causal
    decoder: GPT-2, and with the groups below the Llama family)."""
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
    mlp: MlpConfig = field(default_factory=MlpConfig)
    """The feed-forward block: its activation, gated or not."""
    norm: NormConfig = field(default_factory=NormConfig)
    """The normalization: its kind, epsilon, bias and place in the layer."""
    bias: bool = True
    """Biases of the attention and MLP projections (Llama, ModernBERT: none)."""
    qkv_bias: bool = False
    """The query/key/value projection has a bias even with bias=false (Qwen2)."""
    tie_embeddings: bool = True
    """gpt: the LM head is the word embedding (GPT-2); false: a weight of its own (Llama)."""
    rotary: RotaryConfig | None = None
    """Rotary positions (RoPE: Llama, ModernBERT), applied to queries and keys by their
    position in the whole sequence; null: a learned table of max_position_embeddings rows
    (BERT, GPT-2). `+model/rotary=on` turns it on with its defaults (then
    `model.rotary.KEY=VALUE`), `model.rotary=null` off."""
    local_attention: LocalAttentionConfig | None = None
    """Sliding-window (local) attention in some layers (ModernBERT); null: every layer attends
    globally. `+model/local_attention=on` turns it on with its defaults, `=null` off."""
    pooler: Pooler = Pooler.tanh
    """bert: tanh (BERT: dense + tanh on the first token, feeding the NSP/SOP head and the
    classifier) or head (ModernBERT: no pair head, pretraining is MLM only with
    data.sentence_pairs=none, what its auto resolves to; the classifier reads dense +
    activation + norm of the pooled sequence)."""
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
        """Whether `layer` attends in a sliding window (local_attention's global_every)."""
        local = self.local_attention
        return local is not None and layer % local.global_every != 0

    def window_of(self, layer: int) -> LocalAttentionConfig | None:
        """`layer`'s sliding window, None for a layer that attends globally."""
        return self.local_attention if self.is_local(layer) else None
