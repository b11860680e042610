"""GPT-2's Hugging Face adapter: GPT2Model, GPT2LMHeadModel. HF keeps q, k and v as [q | k |
v] blocks of a transposed Conv1D ([in, out])."""

from __future__ import annotations

from typing import Any

from tpformer.config.families.gpt2 import GPT2
from tpformer.config.schema import (
    Activation,
    Arch,
    MlpConfig,
    ModelConfig,
    NormConfig,
    NormPosition,
)
from tpformer.interop.families.base import (
    HFAdapter,
    classic_keys,
    export_class_of,
    mismatches,
)
from tpformer.interop.hf_rules import FusedQKV, Plain, Rule, linear_rules, norm_rules


def gpt2_key_map(config: ModelConfig, task: str, hf_prefix: str) -> dict[str, Rule]:
    ours = "" if task == "base" else "transformer."
    p = hf_prefix
    rules: dict[str, Rule] = {
        f"{ours}wte.weight": Plain(f"{p}wte.weight"),
        f"{ours}wpe.weight": Plain(f"{p}wpe.weight"),
        **norm_rules(f"{ours}norm", f"{p}ln_f"),
    }
    for i in range(config.num_layers):
        o, t = f"{ours}decoder.layers.{i}", f"{p}h.{i}"
        rules[f"{o}.attention.qkv.weight"] = FusedQKV((f"{t}.attn.c_attn.weight",), transposed=True)
        rules[f"{o}.attention.qkv.bias"] = FusedQKV((f"{t}.attn.c_attn.bias",))
        rules.update(linear_rules(f"{o}.attention.out", f"{t}.attn.c_proj", transposed=True))
        rules.update(norm_rules(f"{o}.attention_norm", f"{t}.ln_1"))
        rules.update(linear_rules(f"{o}.mlp.fc_in", f"{t}.mlp.c_fc", transposed=True))
        rules.update(linear_rules(f"{o}.mlp.fc_out", f"{t}.mlp.c_proj", transposed=True))
        rules.update(norm_rules(f"{o}.mlp_norm", f"{t}.ln_2"))
    return rules


def gpt2_config(hf: dict) -> ModelConfig:
    """A GPT-2 config.json as a decoder ModelConfig."""
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
        mlp=MlpConfig(activation=Activation.gelu_tanh),
        norm=NormConfig(eps=hf["layer_norm_epsilon"], position=NormPosition.pre),
        init_std=hf.get("initializer_range", 0.02),
    )


def gpt2_export_problems(config: ModelConfig) -> list[str]:
    """The keys of a decoder config with learned positions that GPT-2's classes cannot hold."""
    wrong = {
        **classic_keys(config),
        "model.mlp.activation": (config.mlp.activation, "gelu_tanh"),
        "model.tie_embeddings": (config.tie_embeddings, True),
    }
    return mismatches(wrong, "GPT-2")


def gpt2_hf_config(config: ModelConfig, architecture: str, **extra: Any) -> Any:
    """A transformers GPT2Config."""
    from transformers import GPT2Config

    problems = gpt2_export_problems(config)
    if problems:
        raise ValueError("cannot export as GPT-2: " + "; ".join(problems))

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
        layer_norm_epsilon=config.norm.eps,
        initializer_range=config.init_std,
        architectures=[architecture],
        **extra,
    )


EXPORTS = {"base": "GPT2Model", "causal_lm": "GPT2LMHeadModel"}


def gpt2_tied(config: ModelConfig, architecture: str) -> dict[str, str]:
    """The LM head, a copy of the word embedding."""
    return {"lm_head.weight": "transformer.wte.weight"} if architecture == "GPT2LMHeadModel" else {}


GPT2_HF = HFAdapter(
    family=GPT2,
    defaults={"gpt2": "GPT2LMHeadModel"},
    classes={"GPT2Model": "base", "GPT2LMHeadModel": "causal_lm"},
    body_prefix="transformer.",
    key_map=gpt2_key_map,
    config_from_hf=gpt2_config,
    config_to_hf=gpt2_hf_config,
    export_class=lambda config, task: export_class_of(EXPORTS, "gpt2", task),
    tied=gpt2_tied,
)
