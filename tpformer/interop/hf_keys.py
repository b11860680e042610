"""Key maps and configs between tpformer and Hugging Face BERT / GPT-2 checkpoints.

Our fused QKV rows are laid out per head as [head, (q, k, v), head_dim]; HF keeps q, k and v
apart (BERT) or as [q | k | v] blocks of a transposed Conv1D (GPT-2).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpformer.config.schema import Activation, Arch, ModelConfig


@dataclass(frozen=True)
class Plain:
    """One HF tensor; `transposed` for GPT-2's Conv1D ([in, out] instead of [out, in])."""

    key: str
    transposed: bool = False


@dataclass(frozen=True)
class FusedQKV:
    """Our per-head interleaved QKV from HF's q, k, v: three keys, or one [q|k|v] key."""

    keys: tuple[str, ...]
    transposed: bool = False


Rule = Plain | FusedQKV


def _linear(ours: str, theirs: str, transposed: bool = False) -> dict[str, Rule]:
    return {
        f"{ours}.weight": Plain(f"{theirs}.weight", transposed),
        f"{ours}.bias": Plain(f"{theirs}.bias"),
    }


def _norm(ours: str, theirs: str) -> dict[str, Rule]:
    return {f"{ours}.weight": Plain(f"{theirs}.weight"), f"{ours}.bias": Plain(f"{theirs}.bias")}


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
        **_norm(f"{ours}embeddings.norm", f"{p}embeddings.LayerNorm"),
        **_linear(f"{ours}pooler", f"{p}pooler.dense"),
    }
    for i in range(config.num_layers):
        o, t = f"{ours}encoder.layers.{i}", f"{p}encoder.layer.{i}"
        for kind in ("weight", "bias"):
            rules[f"{o}.attention.qkv.{kind}"] = FusedQKV(
                tuple(f"{t}.attention.self.{x}.{kind}" for x in ("query", "key", "value"))
            )
        rules.update(_linear(f"{o}.attention.out", f"{t}.attention.output.dense"))
        rules.update(_norm(f"{o}.attention_norm", f"{t}.attention.output.LayerNorm"))
        rules.update(_linear(f"{o}.mlp.fc_in", f"{t}.intermediate.dense"))
        rules.update(_linear(f"{o}.mlp.fc_out", f"{t}.output.dense"))
        rules.update(_norm(f"{o}.mlp_norm", f"{t}.output.LayerNorm"))
    if task == "pretraining":
        rules.update(_linear("mlm_transform", "cls.predictions.transform.dense"))
        rules.update(_norm("mlm_norm", "cls.predictions.transform.LayerNorm"))
        rules["mlm_bias"] = Plain("cls.predictions.bias")
        rules.update(_linear("nsp", "cls.seq_relationship"))
    if task == "classification":
        rules.update(_linear("classifier", "classifier"))
    return rules


def gpt_key_map(config: ModelConfig, task: str, hf_prefix: str) -> dict[str, Rule]:
    ours = "" if task == "base" else "transformer."
    p = hf_prefix
    rules: dict[str, Rule] = {
        f"{ours}wte.weight": Plain(f"{p}wte.weight"),
        f"{ours}wpe.weight": Plain(f"{p}wpe.weight"),
        **_norm(f"{ours}norm", f"{p}ln_f"),
    }
    for i in range(config.num_layers):
        o, t = f"{ours}decoder.layers.{i}", f"{p}h.{i}"
        rules[f"{o}.attention.qkv.weight"] = FusedQKV((f"{t}.attn.c_attn.weight",), transposed=True)
        rules[f"{o}.attention.qkv.bias"] = FusedQKV((f"{t}.attn.c_attn.bias",))
        rules.update(_linear(f"{o}.attention.out", f"{t}.attn.c_proj", transposed=True))
        rules.update(_norm(f"{o}.attention_norm", f"{t}.ln_1"))
        rules.update(_linear(f"{o}.mlp.fc_in", f"{t}.mlp.c_fc", transposed=True))
        rules.update(_linear(f"{o}.mlp.fc_out", f"{t}.mlp.c_proj", transposed=True))
        rules.update(_norm(f"{o}.mlp_norm", f"{t}.ln_2"))
    return rules


KEY_MAPS: dict[str, Callable[[ModelConfig, str, str], dict[str, Rule]]] = {
    "bert": bert_key_map,
    "gpt": gpt_key_map,
}

_MLM_TIED = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
HF_TIED = {
    "BertForMaskedLM": _MLM_TIED,
    "BertForPreTraining": _MLM_TIED,
    "GPT2LMHeadModel": {"lm_head.weight": "transformer.wte.weight"},
}
"""HF keys that are tied copies of another key (written on export, accepted on load)."""


# ----------------------------------------------------------------------------- configs


def read_hf_config(directory: str | Path) -> dict:
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory; pass a save_pretrained directory")
    path = directory / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{directory} has no config.json; pass a save_pretrained directory")
    return json.loads(path.read_text())


def model_config_from_hf(hf: dict) -> ModelConfig:
    """ModelConfig from a HF config.json dict (BERT or GPT-2)."""
    if hf.get("model_type") == "bert":
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
            activation=Activation.gelu,
            layer_norm_eps=hf["layer_norm_eps"],
            init_std=hf.get("initializer_range", 0.02),
        )
    if hf.get("model_type") == "gpt2":
        return ModelConfig(
            arch=Arch.gpt,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["n_embd"],
            num_layers=hf["n_layer"],
            num_heads=hf["n_head"],
            intermediate_size=hf.get("n_inner") or 4 * hf["n_embd"],
            max_position_embeddings=hf["n_positions"],
            type_vocab_size=0,
            dropout=hf["resid_pdrop"],
            attention_dropout=hf["attn_pdrop"],
            activation=Activation.gelu_tanh,
            layer_norm_eps=hf["layer_norm_epsilon"],
            init_std=hf.get("initializer_range", 0.02),
        )
    raise ValueError(
        f"model_type={hf.get('model_type')!r} is not supported; use a BERT or GPT-2 checkpoint"
    )


def hf_config_from_model(config: ModelConfig, architecture: str, **extra: Any) -> Any:
    """A transformers config object for `config` (used by export)."""
    from transformers import BertConfig, GPT2Config

    if config.arch == "bert":
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
            layer_norm_eps=config.layer_norm_eps,
            initializer_range=config.init_std,
            architectures=[architecture],
            **extra,
        )
    return GPT2Config(
        vocab_size=config.vocab_size,
        n_embd=config.hidden_size,
        n_layer=config.num_layers,
        n_head=config.num_heads,
        n_inner=config.intermediate_size,
        n_positions=config.max_position_embeddings,
        resid_pdrop=config.dropout,
        embd_pdrop=config.dropout,
        attn_pdrop=config.attention_dropout,
        activation_function="gelu_new",
        layer_norm_epsilon=config.layer_norm_eps,
        initializer_range=config.init_std,
        architectures=[architecture],
        **extra,
    )
