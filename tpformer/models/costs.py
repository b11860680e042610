"""The one count of a model's work and size: the FLOPs of a layer, a head and a training step,
and the parameters of a layer, the embedding and the head on one TP rank. The loop's MFU, the
planner's step time and memory, the pipeline's balanced split, gpu_check and the published-run
check all call it.

FLOPs count the matmuls (2 per multiply-add) and attention's two batched products, as
`torch.utils.flop_counter.FlopCounterMode` does (a local layer's over its band for the MFU,
over every key for what the dense kernels execute); a backward costs twice its forward, and a
recomputed layer adds its forward once more. Elementwise work (norms, activations, dropout,
softmax, the loss) is not counted. `tests/models/test_costs.py` holds `step_flops` to
FlopCounterMode on a real forward and backward of every preset's shape.
"""

from __future__ import annotations

from tpformer.config.schema import ModelConfig
from tpformer.layers.embedding import padded_vocab_size
from tpformer.layers.grouped_qkv import held_kv_heads, projected_kv_heads

TASKS = ("pretraining", "causal_lm", "classification")


def layer_matrix_elements(config: ModelConfig) -> int:
    """One layer's weight-matrix elements: QKV (keys and values of num_kv_heads heads), the
    attention output, and the MLP's two matrices (three when gated)."""
    h, f = config.hidden_size, config.intermediate_size
    kv = 2 * config.kv_heads * (h // config.num_heads)
    return h * (h + kv) + h * h + config.mlp.matrices * h * f


def kv_elements(config: ModelConfig) -> int:
    """The key/value projection's weight elements (all heads)."""
    return 2 * config.kv_heads * (config.hidden_size // config.num_heads) * config.hidden_size


def rank_matrix_elements(config: ModelConfig, tp: int) -> float:
    """The weight elements one TP rank multiplies per token in one layer: its share of every
    matrix, the key/value rows of the heads it projects (layers/grouped_qkv.py: its share, or
    with fewer key/value heads than ranks its query heads' one, whole)."""
    per_head = kv_elements(config) // config.kv_heads
    own = per_head * projected_kv_heads(config.kv_heads, tp)
    return (layer_matrix_elements(config) - kv_elements(config)) / tp + own


def layer_flops_per_token(config: ModelConfig, seq: int) -> int:
    """Forward FLOPs of one transformer layer per token: its matmuls (layer_matrix_elements),
    and attention's QK^T and PV over `seq` keys (every key, as the fused kernels compute
    them; a causal mask does not halve the count)."""
    return 2 * layer_matrix_elements(config) + 4 * seq * config.hidden_size


def attended_pairs(seq: int, window: int | None) -> int:
    """(query, key) pairs one sequence's attention needs: every key for a global layer
    (`window` None; a causal mask does not halve it), the band |query - key| <= window / 2 for
    a local one (r = window / 2: 2r + 1 keys per query, fewer within r of either end)."""
    reach = seq if window is None else window // 2
    if reach >= seq - 1:
        return seq * seq
    return seq * (2 * reach + 1) - reach * (reach + 1)


def attention_flops_per_sample(config: ModelConfig, seq: int, *, banded: bool = True) -> int:
    """Forward FLOPs of QK^T and PV over all layers for one sequence: local layers by their
    band (`banded`, the work the task needs), or every layer over every key (what the dense
    kernels and FlopCounterMode count: the band mask's zeros are computed)."""
    h = config.hidden_size
    return sum(
        4 * h * attended_pairs(seq, _window(config, i) if banded else None)
        for i in range(config.num_layers)
    )


def _window(config: ModelConfig, layer: int) -> int | None:
    local = config.window_of(layer)
    return None if local is None else local.window


def head_flops_per_token(config: ModelConfig, vocab: int | None = None) -> int:
    """Forward FLOPs of the vocabulary head per token it runs on: BERT's transform and the
    projection, GPT's projection; `vocab` rows (default the real vocabulary; the executed
    count passes the padded one)."""
    h, v = config.hidden_size, vocab or config.vocab_size
    return 2 * (h * h + h * v) if config.arch == "bert" else 2 * h * v


def pooled_flops_per_sample(config: ModelConfig, task: str, num_labels: int = 2) -> int:
    """Forward FLOPs of the per-sample heads: BERT's pooler and its NSP/SOP (2 classes) or
    classifier (num_labels) on the first token (ModernBERT's pool head: the same dense layer,
    and no pair head in pretraining); GPT has none."""
    if config.arch != "bert" or task == "causal_lm":
        return 0
    if task == "pretraining" and config.pooler == "head":  # MLM only: no pair head
        return 0
    h = config.hidden_size
    classes = 2 if task == "pretraining" else num_labels
    return 2 * (h * h + h * classes)


def step_flops(
    config: ModelConfig,
    *,
    samples: int,
    seq: int,
    head_tokens: float,
    task: str = "pretraining",
    num_labels: int = 2,
    recomputed_layers: float = 0.0,
    vocab: int | None = None,
    banded: bool = True,
) -> float:
    """FLOPs of one training step over `samples` sequences of `seq` tokens: the layers over
    every token (a local layer's attention over its band: `attention_flops_per_sample`), the
    vocabulary head over `head_tokens` (BERT: the masked ones), the per-sample heads, forward +
    backward (3x forward), plus the forward of `recomputed_layers` average layers again
    (activation recomputation; 0 for the MFU, which counts the work the task needs)."""
    if task not in TASKS:
        raise ValueError(f"task={task!r}; one of {TASKS}")
    layers = samples * (
        config.num_layers * seq * 2 * layer_matrix_elements(config)
        + attention_flops_per_sample(config, seq, banded=banded)
    )
    forward = (
        layers
        + head_tokens * head_flops_per_token(config, vocab)
        + samples * pooled_flops_per_sample(config, task, num_labels)
    )
    return 3.0 * forward + recomputed_layers * (layers / config.num_layers)


def executed_flops(
    config: ModelConfig,
    *,
    samples: int,
    seq: int,
    head_rows: float,
    padded_vocab: int,
    task: str = "pretraining",
    num_labels: int = 2,
) -> float:
    """What the step executes, as FlopCounterMode counts it, beside the work `step_flops`
    credits: the head over the rows it gathers (`head_rows`: BERT's labeled positions padded
    per batch) and the padded vocabulary, local layers' attention over every key (the band
    mask's zeros are computed; the counter credits flash's own window with the whole sequence
    too), and the fused attention backward's recomputation of QK^T (half an attention forward
    per layer)."""
    attention = samples * seq * 4 * seq * config.hidden_size
    needed = step_flops(
        config,
        samples=samples,
        seq=seq,
        head_tokens=head_rows,
        task=task,
        num_labels=num_labels,
        vocab=padded_vocab,
        banded=False,
    )
    return needed + 0.5 * attention * config.num_layers


def rank_executed_flops(
    config: ModelConfig,
    *,
    samples: int,
    seq: int,
    layers: int,
    tp: int = 1,
    cp: int = 1,
    recompute: str = "none",
    head_rows: float = 0.0,
    padded_vocab: int | None = None,
    pooled: bool = False,
    task: str = "pretraining",
    num_labels: int = 2,
) -> float:
    """What one rank executes in a step, as FlopCounterMode counts it (a dry run's count):
    `layers` layers over `samples` sequences, of which it holds seq / cp positions (each
    against every key), their matmuls and heads split over `tp`; the fused attention backward's
    recomputation of QK^T; the forward again of recomputed layers (full; up to the last tensor
    a layer saves) or attention cores (selective); the vocabulary head over `head_rows` rows
    (BERT's transform whole on every TP rank, the projection split) and, with `pooled`, the
    per-sample heads (whole)."""
    h = config.hidden_size
    tokens = samples * seq / cp
    attention = tokens * 4 * seq * h / tp
    forward = tokens * 2 * rank_matrix_elements(config, tp) + attention
    # non-reentrant checkpoint stops recomputing at the last tensor the block saved: without
    # dropout after it, the MLP's output projection is not run again
    last = 0.0 if config.dropout > 0 else tokens * 2 * h * config.intermediate_size / tp
    again = {"full": forward - last, "selective": attention}.get(recompute, 0.0)
    total = layers * (3 * forward + 0.5 * attention + again)
    if head_rows:
        vocab = padded_vocab or config.vocab_size
        transform = 2 * h * h if config.arch == "bert" else 0
        total += 3 * head_rows * (transform + 2 * h * vocab / tp)
    if pooled:
        total += 3 * samples * pooled_flops_per_sample(config, task, num_labels)
    return total


def layer_params(config: ModelConfig, tp: int) -> int:
    """One layer's parameters on one TP rank: QKV, FFN-in and their biases and the two output
    matrices are split; the norms and the output biases are replicated, and so is the
    key/value projection when there are fewer key/value heads than ranks."""
    h, f = config.hidden_size, config.intermediate_size
    kv = 2 * config.kv_heads * (h // config.num_heads)
    qkv_bias = config.bias or config.qkv_bias
    split_biases = (h + kv if qkv_bias else 0) + (
        (config.mlp.matrices - 1) * f if config.bias else 0
    )
    replicated = 2 * norm_params(config) + (2 * h if config.bias else 0)
    kv_params = kv_elements(config) + (kv if qkv_bias else 0)  # all heads
    held = kv_params // config.kv_heads * held_kv_heads(config.kv_heads, tp)
    return (layer_matrix_elements(config) + split_biases - kv_params) // tp + held + replicated


def norm_params(config: ModelConfig) -> int:
    """One norm's parameters: a weight, and a bias for a LayerNorm with biases."""
    return config.norm.params(config.hidden_size)


def word_embedding_params(config: ModelConfig, tp: int) -> int:
    """The vocabulary-parallel word embedding on one TP rank (padded rows included)."""
    return padded_vocab_size(config.vocab_size, tp, config.pad_vocab_to) // tp * config.hidden_size


def embedding_params(config: ModelConfig, tp: int) -> int:
    """The embedding stage on one TP rank: the word embedding, positions, BERT's segments and
    its norm."""
    h = config.hidden_size
    positions = config.max_position_embeddings * h if config.rotary is None else 0
    if config.arch == "bert":
        segments = config.type_vocab_size * h
        return word_embedding_params(config, tp) + positions + segments + norm_params(config)
    return word_embedding_params(config, tp) + positions


def first_layer_saving(config: ModelConfig) -> int:
    """Parameters the first layer lacks: a pre-norm encoder's (ModernBERT) first layer has no
    attention norm, its input being the normalized embeddings."""
    pre_norm = config.norm.position == "pre"
    return norm_params(config) if config.arch == "bert" and pre_norm else 0


def head_params(
    config: ModelConfig, tp: int, *, nsp: bool, task: str = "pretraining", num_labels: int = 2
) -> int:
    """The head on one TP rank, without the tied word embedding: BERT's transform, norm and
    vocabulary bias (vocabulary-parallel), and its pooler and NSP classifier; GPT's final
    norm, and its own LM head (vocabulary-parallel) when not tied; a classification task's
    pooler (ModernBERT: dense, norm) and classifier (whole on every rank); a pre-norm
    encoder's final norm."""
    h = config.hidden_size
    dense = h * h + (h if config.bias else 0)
    pre_norm = config.norm.position == "pre"
    final = norm_params(config) if pre_norm and config.arch == "bert" else 0
    if task == "classification":
        pool = (h * h + h) if config.pooler == "tanh" else dense + norm_params(config)
        return final + pool + (h * num_labels + num_labels)
    if config.arch != "bert":
        untied = 0 if config.tie_embeddings else word_embedding_params(config, tp)
        return norm_params(config) + untied
    vocab = padded_vocab_size(config.vocab_size, tp, config.pad_vocab_to) // tp
    pair = (h * h + h) + 2 * h + 2 if nsp else 0
    return final + dense + norm_params(config) + vocab + pair
