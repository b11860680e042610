"""The rules of the model group: a model that can be built and split over the TP group, the
keys that shape the architecture families (Llama's grouped-query attention and rotary
positions, ModernBERT's local attention and heads), what a model cannot run under at a layout,
and the pair head against the data it trains on."""

from __future__ import annotations

from tpformer.config.families import family_of
from tpformer.config.rules.choices import check_choices
from tpformer.config.schema import DataConfig, ModelConfig
from tpformer.parallel.layout import divisors


def validate_model(model: ModelConfig, tp: int) -> None:
    """Raise ValueError if `model` cannot be built or cannot be split over `tp` ranks."""
    check_choices(model, "model.")
    if model.hidden_size % model.num_heads != 0:
        raise ValueError(
            f"model.hidden_size={model.hidden_size} is not divisible by "
            f"model.num_heads={model.num_heads}; "
            f"valid head counts are {divisors(model.hidden_size)}"
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
    validate_model_family(model, tp)


FP8_MULTIPLE = 16
"""Every dimension of an fp8 matmul's operands is a multiple of 16 on GPUs (layers/fp8.py)."""


def validate_fp8(model: ModelConfig, tp: int) -> None:
    """parallel.precision=fp8: the widths of the blocks' linear layers on each of `tp` ranks
    (hidden size, its TP share, the FFN's share, a rank's key/value rows) are multiples of 16,
    as the GPUs' fp8 matmuls need (token counts are padded to one)."""
    head_dim = model.hidden_size // model.num_heads
    kv_rows = 2 * head_dim * max(model.kv_heads // tp, 1)
    widths = {
        "model.hidden_size": model.hidden_size,
        f"model.hidden_size / parallel.tensor={tp}": model.hidden_size // tp,
        f"model.intermediate_size / parallel.tensor={tp}": model.intermediate_size // tp,
        "a rank's key/value rows (2 x head size x its key/value heads)": kv_rows,
    }
    for what, width in widths.items():
        if width % FP8_MULTIPLE:
            raise ValueError(
                f"parallel.precision=fp8 needs every linear width a multiple of {FP8_MULTIPLE} "
                f"(the GPUs' fp8 matmuls): {what} is {width}; use parallel.precision=bf16, "
                "another model size or another parallel.tensor"
            )


def validate_model_family(model: ModelConfig, tp: int) -> None:
    """The family keys: grouped-query heads that split over `tp` or are replicated over it
    (layers/grouped_qkv.py), rotary positions with an even head size, then the rules of the
    model's family (config/families/: BERT's tied MLM head, the encoder-only keys on encoders
    only)."""
    kv = model.kv_heads
    if model.num_heads % kv != 0:
        raise ValueError(
            f"model.num_kv_heads={model.num_kv_heads} must divide model.num_heads="
            f"{model.num_heads} (valid: {divisors(model.num_heads)}; 0 means num_heads)"
        )
    if kv % tp != 0 and tp % kv != 0:
        valid = sorted({*divisors(kv), *(kv * m for m in divisors(model.num_heads // kv))})
        raise ValueError(
            f"parallel.tensor={tp} and model.num_kv_heads={kv}: each TP rank holds whole "
            "key/value heads (TP divides them) or one replicated head (they divide TP); "
            f"valid degrees: {valid}"
        )
    if model.rotary is not None and (model.hidden_size // model.num_heads) % 2:
        raise ValueError(
            f"model.rotary needs an even head size (hidden_size / num_heads = "
            f"{model.hidden_size // model.num_heads})"
        )
    family_of(model).check(model)


def validate_pair_head(model: ModelConfig, data: DataConfig) -> None:
    """BERT's pair head trains on sentence pairs; ModernBERT's recipe (pooler=head) has none."""
    if model.arch != "bert":
        return
    if model.pooler == "head" and data.sentence_pairs != "none":
        raise ValueError(
            f"model.pooler=head has no pair head to train data.sentence_pairs="
            f"{data.sentence_pairs} on: set data.sentence_pairs=none (MLM only, ModernBERT's "
            "recipe) or model.pooler=tanh"
        )
    if model.pooler == "tanh" and data.sentence_pairs == "none":
        raise ValueError(
            "data.sentence_pairs=none trains no pair head, and model.pooler=tanh's pooler and "
            "NSP head would get no gradient: set model.pooler=head, or sentence_pairs=nsp/sop"
        )
