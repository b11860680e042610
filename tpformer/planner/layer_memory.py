"""What one transformer layer keeps for backward on one rank: Korthikanti et al.'s per-layer
terms, with the blocks of the Llama family (gated MLP, rotary, grouped-query attention) and
context parallelism's ring attention."""

from __future__ import annotations

from dataclasses import dataclass

from tpformer.config.schema import ModelConfig


def layer_activation_bytes(
    s: int,
    b: int,
    h: int,
    a: int,
    f: int,
    *,
    tp: int,
    sequence_parallel: bool,
    recompute: str,
    itemsize: int,
    mask_bytes: int = 1,
    fused_attention: bool = False,
    context: int = 1,
    attention_dropout: bool = False,
    shape: LayerShape | None = None,
    masked: bool = True,
) -> float:
    """Bytes one transformer layer keeps for backward on one rank (Korthikanti et al. 2022;
    tensors of `itemsize` bytes, dropout masks of `mask_bytes`, FFN width f, `masked`: a padded
    batch). Kept, in elements: LayerNorm inputs 2sbh, QKV and MLP inputs 2sbh (replicated under
    TP, 1/t of the sequence under sequence parallelism); q, k, v 3sbh, attention output sbh,
    GELU input and output 2sbf (1/t under TP); softmax output and its dropout 2as^2b (1/t);
    masks 2sbh + as^2b (times mask_bytes). 16-bit, 1-byte masks, f = 4h: sbh(10 + 24/t +
    5as/(ht)), with SP sbh/t (34 + 5as/h), SP + selective 34 sbh/t. selective drops the as^2
    terms, and so does a fused attention kernel (`fused_attention`: flash / memory-efficient
    SDPA keeps only q, k, v, its output and a row statistic); full keeps only the layer's input.

    `context` > 1 (context parallelism): every sbh term holds s / cp positions, and the core is
    ring attention, which keeps no probabilities: its output again (sbh / (cp t), the output
    projection keeps its own copy), its fp32 log-sum-exp (4 a s b / (cp t) bytes) and, with
    exact-mode attention dropout (`attention_dropout`), the bool keep mask of its queries
    against every key (a s^2 b / (cp t) bytes).

    `shape` (the Llama family's blocks, LayerShape.of(config)): a gated MLP keeps its two
    projections' output, the activation and the product (4 sbf / t instead of 2); rotary
    queries and keys and expanded grouped keys and values (not `groups_in_place`) are new
    tensors, and the fused QKV output stays only while a view of it is kept (RMSNorm keeps
    what LayerNorm keeps: layers/norm.py); rotary's cos and sin ([s, head_dim] each, shared
    by the queries and keys) are kept too; no hidden dropout keeps no masks. (fp8: + below.)"""
    q = tp if sequence_parallel else 1  # what the LayerNorm/dropout/residual region is split by
    local = s / context
    sbh, attention = local * b * h, a * s * local * b
    if recompute == "full":
        return itemsize * sbh / q
    shape = shape or LayerShape()
    flash = fused_attention and itemsize == 2 and context == 1 and not masked
    core = shape.attention_elements(sbh, groups_in_place=flash or recompute == "selective")
    mlp = (4 if shape.gated else 2) * local * b * f
    masks = mask_bytes * 2 * sbh / q if shape.dropout else 0.0
    rotary = 2 * local * (h / a) * itemsize if shape.rotary else 0.0  # its cos and sin
    kept = itemsize * (4 * sbh / q + (core + mlp) / tp) + masks + rotary
    if recompute == "selective":
        return kept
    if context > 1:
        kept += (itemsize * sbh + 4 * a * local * b) / tp
        return kept + (attention / tp if attention_dropout else 0.0)
    if not fused_attention:
        kept += (2 * itemsize + mask_bytes) * attention / tp
    return kept


def fp8_linear_change(
    sbh: float, sbf: float, tp: int, sequence_parallel: bool, itemsize: int, own_copy: bool
) -> float:
    """Bytes the fp8 linears (parallel.precision=fp8, layers/fp8.py) change in what a layer keeps
    without full recomputation (negative: saved); sbh and sbf of a rank's s / cp positions. The
    QKV and MLP inputs (sbh each, replicated over TP; under sequence parallelism the gathered
    linears keep their sbh / t chunk) are kept as fp8 casts instead; so is the MLP's output
    projection's input (sbf / t). The attention output projection keeps an fp8 cast of its
    input (sbh / t): instead of the compute-dtype tensor where only it kept that (`own_copy`:
    context parallelism, selective recomputation, an unfused core), beside it where the fused
    attention kernel keeps its output too."""
    saved = itemsize - 1
    inputs = 2 * sbh / (tp if sequence_parallel else 1) + sbf / tp
    attention_output = -saved * sbh / tp if own_copy else sbh / tp
    return attention_output - saved * inputs


@dataclass(frozen=True)
class LayerShape:
    """What of a layer's blocks sets the tensors it keeps, beyond its sizes (GPT-2 and BERT
    by default): the MLP gated, rotary positions, key/value heads per query head, and whether
    the hidden dropout keeps masks."""

    gated: bool = False
    rotary: bool = False
    kv_fraction: float = 1.0
    """num_kv_heads / num_heads (a rank's key/value heads over its query heads)."""
    dropout: bool = True
    split: bool = False
    """Grouped-query attention's separate query and key/value projections."""

    @classmethod
    def of(cls, config: ModelConfig, tp: int = 1) -> LayerShape:
        """`tp`: with fewer key/value heads than ranks each rank projects one of them, so per
        rank they are 1 / (num_heads / tp) of its query heads (kv_fraction counts per rank)."""
        kv = config.kv_heads if config.kv_heads % tp == 0 else tp
        return cls(
            gated=config.mlp.gated,
            rotary=config.rotary is not None,
            kv_fraction=kv / config.num_heads,
            dropout=config.dropout > 0,
            split=config.kv_heads < config.num_heads,
        )

    def attention_elements(self, sbh: float, *, groups_in_place: bool = False) -> float:
        """Elements the attention keeps of one micro-batch (whole heads; divide by TP): the
        query, key and value the core reads, its output, and each projection output while
        one of them is a view of it: the fused QKV output (multi-head), or the query's and
        the key/value's (grouped-query, layers/grouped_qkv.py). Rotary queries and keys, and
        keys and values expanded to a rank's query heads, are new tensors. `groups_in_place`:
        the flash kernel reads grouped heads as they are (16-bit, no mask:
        layers/attention_core.takes_groups), or the core that expands them is recomputed."""
        expanded = self.kv_fraction < 1 and not groups_in_place
        q_new, k_new, v_new = self.rotary, self.rotary or expanded, expanded
        new = (q_new + (1 if expanded else self.kv_fraction) * (k_new + v_new)) * sbh
        if not self.split:
            viewed = not (q_new and k_new and v_new)
            return new + ((1 + 2 * self.kv_fraction) * sbh if viewed else 0.0) + sbh
        kept_q = 0.0 if q_new else sbh
        kept_kv = 0.0 if k_new and v_new else 2 * self.kv_fraction * sbh
        return new + kept_q + kept_kv + sbh
