"""ModernBERT's Hugging Face adapter: ModernBertModel, ModernBertForMaskedLM,
ModernBertForSequenceClassification.

ModernBERT keeps the fused QKV as [q | k | v] blocks (Wqkv) and the GeGLU input as one
[activated | multiplied] matrix (Wi); the first layer has no attention norm; its MLM head
(dense, activation, norm) feeds a decoder tied to the token embedding, with a bias.
"""

from __future__ import annotations

from typing import Any

from tpformer.config.families.modernbert import MODERNBERT
from tpformer.config.schema import (
    Activation,
    Arch,
    ClassifierPooling,
    LocalAttentionConfig,
    MlpConfig,
    ModelConfig,
    NormConfig,
    NormPosition,
    Pooler,
    RotaryConfig,
)
from tpformer.interop.families.base import HFAdapter, export_class_of, mismatches
from tpformer.interop.hf_rules import FusedQKV, GatedRows, Plain, Rule

ACTIVATIONS = {"gelu": Activation.gelu, "gelu_new": Activation.gelu_tanh,
               "gelu_pytorch_tanh": Activation.gelu_tanh, "silu": Activation.silu}  # fmt: skip
"""ModernBERT's hidden_activation names tpformer builds."""


def _rules(ours: str, theirs: str, bias: bool, rule: type = Plain) -> dict[str, Rule]:
    """weight (and bias) of one module, each through `rule` (Plain, or GatedRows of one key)."""
    kinds = ("weight", "bias") if bias else ("weight",)
    if rule is GatedRows:
        return {f"{ours}.{k}": GatedRows((f"{theirs}.{k}",)) for k in kinds}
    return {f"{ours}.{k}": Plain(f"{theirs}.{k}") for k in kinds}


def modernbert_key_map(config: ModelConfig, task: str, hf_prefix: str) -> dict[str, Rule]:
    """Our encoder parameter names (with ModernBERT's options) -> ModernBERT keys."""
    ours, p, bias = ("" if task == "base" else "bert."), hf_prefix, config.bias
    norm_bias = config.norm.bias
    rules: dict[str, Rule] = {
        f"{ours}embeddings.word_embeddings.weight": Plain(f"{p}embeddings.tok_embeddings.weight"),
        **_rules(f"{ours}embeddings.norm", f"{p}embeddings.norm", norm_bias),
        **_rules(f"{ours}final_norm", f"{p}final_norm", norm_bias),
    }
    for i in range(config.num_layers):
        o, t = f"{ours}encoder.layers.{i}", f"{p}layers.{i}"
        if i > 0:
            rules.update(_rules(f"{o}.attention_norm", f"{t}.attn_norm", norm_bias))
        for kind in ("weight", "bias") if bias else ("weight",):
            rules[f"{o}.attention.qkv.{kind}"] = FusedQKV((f"{t}.attn.Wqkv.{kind}",))
        rules.update(_rules(f"{o}.attention.out", f"{t}.attn.Wo", bias))
        rules.update(_rules(f"{o}.mlp_norm", f"{t}.mlp_norm", norm_bias))
        rules.update(_rules(f"{o}.mlp.fc_in", f"{t}.mlp.Wi", bias, GatedRows))
        rules.update(_rules(f"{o}.mlp.fc_out", f"{t}.mlp.Wo", bias))
    if task == "pretraining":
        rules.update(_rules("mlm_transform", "head.dense", bias))
        rules.update(_rules("mlm_norm", "head.norm", norm_bias))
        rules["mlm_bias"] = Plain("decoder.bias")
    if task == "classification":
        rules.update(_rules("pool_head.0", "head.dense", bias))
        rules.update(_rules("pool_head.2", "head.norm", norm_bias))
        rules.update(_rules("classifier", "classifier", True))
    return rules


def _local_attention(hf: dict) -> LocalAttentionConfig | None:
    """ModernBERT's layer_types as local attention (None: every layer global); a pattern other
    than global every n-th layer from the first is refused."""
    layers = hf["num_hidden_layers"]
    kinds = hf.get("layer_types")
    every = int(hf.get("global_attn_every_n_layers", 3))
    if kinds is None:
        kinds = ["sliding_attention" if i % every else "full_attention" for i in range(layers)]
    local = [i for i, kind in enumerate(kinds) if kind == "sliding_attention"]
    if not local:
        return None
    full = [i for i in range(layers) if i not in local]
    every = full[1] - full[0] if len(full) > 1 else layers
    if [i for i in range(layers) if i % every == 0] != full:
        raise ValueError(
            f"layer_types={kinds} is not supported: tpformer attends globally in layers 0, n, "
            "2n, ... (model.local_attention.global_every) and locally in the others"
        )
    return LocalAttentionConfig(window=int(hf.get("local_attention", 128)), global_every=every)


def _rope_theta(hf: dict, kind: str, legacy: str, default: float) -> float:
    params = (hf.get("rope_parameters") or {}).get(kind) or {}
    if params.get("rope_type", "default") != "default":
        raise ValueError(
            f"rope_parameters[{kind!r}].rope_type={params['rope_type']!r} is not supported in "
            "a ModernBERT checkpoint; only 'default'"
        )
    return float(params.get("rope_theta", hf.get(legacy, default)))


def modernbert_config(hf: dict) -> ModelConfig:
    """A ModernBERT config.json as an encoder ModelConfig; a shape tpformer does not build
    (mixed biases, another activation, a layer pattern other than global every n-th) is
    refused by name."""
    biases = {k: bool(hf.get(k, d)) for k, d in (("attention_bias", False), ("mlp_bias", False),
              ("classifier_bias", False))}  # fmt: skip
    refuse = []
    if len(set(biases.values())) > 1:
        refuse.append(f"{biases} (tpformer has one model.bias for all of them)")
    act = hf.get("hidden_activation", "gelu")
    if act not in ACTIVATIONS:
        refuse.append(f"hidden_activation={act!r} (supported: {sorted(ACTIVATIONS)})")
    if hf.get("classifier_activation", act) != act:
        refuse.append(
            f"classifier_activation={hf['classifier_activation']!r} (tpformer's heads use "
            f"hidden_activation={act!r})"
        )
    if not hf.get("decoder_bias", True):
        refuse.append("decoder_bias=false (tpformer's MLM decoder has a bias)")
    if not hf.get("tie_word_embeddings", True):
        refuse.append("tie_word_embeddings=false (tpformer's MLM decoder is tied)")
    if refuse:
        raise ValueError("this modernbert checkpoint is not supported: " + "; ".join(refuse))
    return ModelConfig(
        arch=Arch.bert,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf["max_position_embeddings"],
        type_vocab_size=0,
        dropout=float(hf.get("embedding_dropout", 0.0)),
        attention_dropout=float(hf.get("attention_dropout", 0.0)),
        mlp=MlpConfig(activation=ACTIVATIONS[act], gated=True),
        norm=NormConfig(
            eps=hf.get("norm_eps", 1e-5),
            bias=bool(hf.get("norm_bias", False)),
            position=NormPosition.pre,
        ),
        bias=biases["attention_bias"],
        rotary=RotaryConfig(
            theta=_rope_theta(hf, "full_attention", "global_rope_theta", 160000.0),
            local_theta=_rope_theta(hf, "sliding_attention", "local_rope_theta", 10000.0),
        ),
        local_attention=_local_attention(hf),
        pooler=Pooler.head,
        classifier_pooling=ClassifierPooling(hf.get("classifier_pooling", "cls")),
        init_std=hf.get("initializer_range", 0.02),
    )


def modernbert_export_problems(config: ModelConfig) -> list[str]:
    """The keys of an encoder config with rotary positions that ModernBERT cannot hold."""
    wrong = {
        "model.norm.kind": (config.norm.kind, "layernorm"),
        "model.mlp.gated": (config.mlp.gated, True),
        "model.norm.position": (config.norm.position, "pre"),
        "model.pooler": (config.pooler, "head"),
        "model.type_vocab_size": (config.type_vocab_size, 0),
        "model.qkv_bias": (config.qkv_bias, False),
        "model.rotary.scaling": (config.rotary.scaling if config.rotary else "none", "none"),
    }
    return mismatches(wrong, "ModernBERT")


def modernbert_hf_config(config: ModelConfig, architecture: str, **extra: Any) -> Any:
    """A transformers ModernBertConfig for an encoder config with ModernBERT's blocks."""
    from transformers import ModernBertConfig

    problems = modernbert_export_problems(config)
    rotary = config.rotary
    if problems or rotary is None:
        raise ValueError("cannot export as ModernBERT: " + "; ".join(problems or ["no rotary"]))
    act = {Activation.gelu: "gelu", Activation.gelu_tanh: "gelu_pytorch_tanh",
           Activation.silu: "silu"}[config.mlp.activation]  # fmt: skip
    layers = config.num_layers
    # ModernBERT's default special ids (50281-50283) lie outside a smaller vocabulary: none
    # unless the exported tokenizer gives them
    special = dict.fromkeys(("pad", "bos", "eos", "cls", "sep"))
    extra = {**{f"{k}_token_id": v for k, v in special.items()}, **extra}
    kinds = ["sliding_attention" if config.is_local(i) else "full_attention" for i in range(layers)]
    return ModernBertConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=config.num_heads,
        hidden_activation=act,
        classifier_activation=act,
        max_position_embeddings=config.max_position_embeddings,
        norm_eps=config.norm.eps,
        attention_bias=config.bias,
        mlp_bias=config.bias,
        norm_bias=config.norm.bias,
        classifier_bias=config.bias,
        embedding_dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        layer_types=kinds,
        local_attention=config.local_attention.window if config.local_attention else 128,
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": rotary.theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": rotary.local_theta},
        },
        classifier_pooling="mean" if config.classifier_pooling == "mean" else "cls",
        initializer_range=config.init_std,
        architectures=[architecture],
        **extra,
    )


EXPORTS = {"base": "ModernBertModel", "pretraining": "ModernBertForMaskedLM",
           "classification": "ModernBertForSequenceClassification"}  # fmt: skip


def modernbert_tied(config: ModelConfig, architecture: str) -> dict[str, str]:
    """The MLM decoder's weight, a copy of the token embedding."""
    if architecture != "ModernBertForMaskedLM":
        return {}
    return {"decoder.weight": "model.embeddings.tok_embeddings.weight"}


MODERNBERT_HF = HFAdapter(
    family=MODERNBERT,
    defaults={"modernbert": "ModernBertForMaskedLM"},
    classes={
        "ModernBertModel": "base",
        "ModernBertForMaskedLM": "pretraining",
        "ModernBertForSequenceClassification": "classification",
    },
    body_prefix="model.",
    key_map=modernbert_key_map,
    config_from_hf=modernbert_config,
    config_to_hf=modernbert_hf_config,
    export_class=lambda config, task: export_class_of(EXPORTS, "modernbert", task),
    tied=modernbert_tied,
)
