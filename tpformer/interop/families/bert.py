"""BERT's Hugging Face adapter: BertModel, BertForPreTraining (and BertForMaskedLM, read),
BertForSequenceClassification. HF keeps q, k and v apart; ours is one fused QKV."""

from __future__ import annotations

from typing import Any

from tpformer.config.families.bert import BERT
from tpformer.config.schema import Activation, Arch, MlpConfig, ModelConfig, NormConfig
from tpformer.interop.families.base import (
    HFAdapter,
    classic_keys,
    export_class_of,
    mismatches,
)
from tpformer.interop.hf_rules import FusedQKV, Plain, Rule, linear_rules, norm_rules


def bert_key_map(config: ModelConfig, task: str, hf_prefix: str) -> dict[str, Rule]:
    """Our parameter name -> rule, for BertModel / BertForPreTraining / ...Classification."""
    ours = "" if task == "base" else "bert."
    p = hf_prefix
    rules: dict[str, Rule] = {
        f"{ours}embeddings.word_embeddings.weight": Plain(f"{p}embeddings.word_embeddings.weight"),
        f"{ours}embeddings.position_embeddings.weight": Plain(
            f"{p}embeddings.position_embeddings.weight"
        ),
        f"{ours}embeddings.token_type_embeddings.weight": Plain(
            f"{p}embeddings.token_type_embeddings.weight"
        ),
        **norm_rules(f"{ours}embeddings.norm", f"{p}embeddings.LayerNorm"),
        **linear_rules(f"{ours}pooler", f"{p}pooler.dense"),
    }
    for i in range(config.num_layers):
        o, t = f"{ours}encoder.layers.{i}", f"{p}encoder.layer.{i}"
        for kind in ("weight", "bias"):
            rules[f"{o}.attention.qkv.{kind}"] = FusedQKV(
                tuple(f"{t}.attention.self.{x}.{kind}" for x in ("query", "key", "value"))
            )
        rules.update(linear_rules(f"{o}.attention.out", f"{t}.attention.output.dense"))
        rules.update(norm_rules(f"{o}.attention_norm", f"{t}.attention.output.LayerNorm"))
        rules.update(linear_rules(f"{o}.mlp.fc_in", f"{t}.intermediate.dense"))
        rules.update(linear_rules(f"{o}.mlp.fc_out", f"{t}.output.dense"))
        rules.update(norm_rules(f"{o}.mlp_norm", f"{t}.output.LayerNorm"))
    if task == "pretraining":
        rules.update(linear_rules("mlm_transform", "cls.predictions.transform.dense"))
        rules.update(norm_rules("mlm_norm", "cls.predictions.transform.LayerNorm"))
        rules["mlm_bias"] = Plain("cls.predictions.bias")
        rules.update(linear_rules("nsp", "cls.seq_relationship"))
    if task == "classification":
        rules.update(linear_rules("classifier", "classifier"))
    return rules


def bert_config(hf: dict) -> ModelConfig:
    """A BERT config.json (absolute positions, gelu) as an encoder ModelConfig."""
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise ValueError(
            f"position_embedding_type={hf['position_embedding_type']!r} is not "
            "supported; only 'absolute'"
        )
    if hf.get("hidden_act", "gelu") != "gelu":
        raise ValueError(f"hidden_act={hf['hidden_act']!r} is not supported; only 'gelu'")
    return ModelConfig(
        arch=Arch.bert,
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        intermediate_size=hf["intermediate_size"],
        max_position_embeddings=hf["max_position_embeddings"],
        type_vocab_size=hf["type_vocab_size"],
        dropout=hf["hidden_dropout_prob"],
        attention_dropout=hf["attention_probs_dropout_prob"],
        mlp=MlpConfig(activation=Activation.gelu),
        norm=NormConfig(eps=hf["layer_norm_eps"]),
        init_std=hf.get("initializer_range", 0.02),
    )


def bert_export_problems(config: ModelConfig) -> list[str]:
    """The keys of an encoder config with learned positions that BERT's classes cannot hold."""
    wrong = {
        **classic_keys(config),
        "model.norm.position": (config.norm.position, "post"),
        "model.mlp.activation": (config.mlp.activation, "gelu"),
        "model.pooler": (config.pooler, "tanh"),
    }
    return mismatches(wrong, "BERT")


def bert_hf_config(config: ModelConfig, architecture: str, **extra: Any) -> Any:
    """A transformers BertConfig."""
    from transformers import BertConfig

    problems = bert_export_problems(config)
    if problems:
        raise ValueError("cannot export as BERT: " + "; ".join(problems))

    return BertConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=config.intermediate_size,
        hidden_act="gelu",
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        hidden_dropout_prob=config.dropout,
        attention_probs_dropout_prob=config.attention_dropout,
        layer_norm_eps=config.norm.eps,
        initializer_range=config.init_std,
        architectures=[architecture],
        **extra,
    )


EXPORTS = {"base": "BertModel", "pretraining": "BertForPreTraining",
           "classification": "BertForSequenceClassification"}  # fmt: skip
_MLM_TIED = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}


def bert_tied(config: ModelConfig, architecture: str) -> dict[str, str]:
    """The MLM decoder's weight and bias, copies of the word embedding and the MLM bias."""
    return _MLM_TIED if architecture in ("BertForMaskedLM", "BertForPreTraining") else {}


BERT_HF = HFAdapter(
    family=BERT,
    defaults={"bert": "BertModel"},
    classes={
        "BertModel": "base",
        "BertForMaskedLM": "pretraining",
        "BertForPreTraining": "pretraining",
        "BertForSequenceClassification": "classification",
    },
    body_prefix="bert.",
    key_map=bert_key_map,
    config_from_hf=bert_config,
    config_to_hf=bert_hf_config,
    export_class=lambda config, task: export_class_of(EXPORTS, "bert", task),
    tied=bert_tied,
)
