"""Key maps and configs between tpformer and Hugging Face BERT, GPT-2 and Llama-family
(Llama, Mistral) checkpoints.

Our fused QKV rows are laid out per key/value head as [group, (q x group, k, v), head_dim]
(multi-head: [head, (q, k, v), head_dim]); HF keeps q, k and v apart (BERT, Llama) or as
[q | k | v] blocks of a transposed Conv1D (GPT-2). A gated MLP's input rows are [unit, (gate,
up)]; Llama keeps gate_proj and up_proj apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpformer.config.schema import (
    Activation,
    Arch,
    ModelConfig,
    Norm,
    PositionEmbedding,
    RopeScaling,
)
from tpformer.interop.hf_modernbert import (
    modernbert_config,
    modernbert_hf_config,
    modernbert_key_map,
)
from tpformer.interop.hf_rules import FusedQKV, GatedRows, Plain, Rule, linear_rules, norm_rules


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


def gpt_key_map(config: ModelConfig, task: str, hf_prefix: str) -> dict[str, Rule]:
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


def llama_key_map(config: ModelConfig, task: str, hf_prefix: str) -> dict[str, Rule]:
    """Our GPT-family parameter names with Llama's options -> LlamaModel / LlamaForCausalLM
    keys (Mistral's are the same)."""
    ours = "" if task == "base" else "transformer."
    p = hf_prefix
    rules: dict[str, Rule] = {
        f"{ours}wte.weight": Plain(f"{p}embed_tokens.weight"),
        f"{ours}norm.weight": Plain(f"{p}norm.weight"),
    }
    if task != "base" and not config.tie_embeddings:
        rules["lm_head.weight"] = Plain("lm_head.weight")
    for i in range(config.num_layers):
        o, t = f"{ours}decoder.layers.{i}", f"{p}layers.{i}"
        kinds = ("weight", "bias") if config.qkv_bias else ("weight",)  # Qwen2's biases
        for kind in kinds:
            if config.kv_heads < config.num_heads:  # grouped-query: layers/grouped_qkv.py
                rules[f"{o}.attention.qkv.q.{kind}"] = Plain(f"{t}.self_attn.q_proj.{kind}")
                rules[f"{o}.attention.qkv.kv.{kind}"] = GatedRows(
                    (f"{t}.self_attn.k_proj.{kind}", f"{t}.self_attn.v_proj.{kind}"),
                    block=config.hidden_size // config.num_heads,
                )
            else:
                rules[f"{o}.attention.qkv.{kind}"] = FusedQKV(
                    tuple(f"{t}.self_attn.{x}_proj.{kind}" for x in "qkv")
                )
        rules[f"{o}.attention.out.weight"] = Plain(f"{t}.self_attn.o_proj.weight")
        rules[f"{o}.attention_norm.weight"] = Plain(f"{t}.input_layernorm.weight")
        rules[f"{o}.mlp.fc_in.weight"] = GatedRows(
            (f"{t}.mlp.gate_proj.weight", f"{t}.mlp.up_proj.weight")
        )
        rules[f"{o}.mlp.fc_out.weight"] = Plain(f"{t}.mlp.down_proj.weight")
        rules[f"{o}.mlp_norm.weight"] = Plain(f"{t}.post_attention_layernorm.weight")
    return rules


def hf_family(config: ModelConfig) -> str:
    """The Hugging Face family a config maps to: bert or modernbert (an encoder with rotary
    positions), gpt2 or llama (a decoder with rotary positions)."""
    if config.arch == "bert":
        return "modernbert" if config.position_embedding == "rope" else "bert"
    return "llama" if config.position_embedding == "rope" else "gpt2"


KEY_MAPS: dict[str, Callable[[ModelConfig, str, str], dict[str, Rule]]] = {
    "bert": bert_key_map,
    "gpt2": gpt_key_map,
    "llama": llama_key_map,
    "modernbert": modernbert_key_map,
}
BODY_PREFIX = {"bert": "bert.", "gpt2": "transformer.", "llama": "model.", "modernbert": "model."}
"""The HF body prefix of each family's task models (absent in the base model's files)."""

_MLM_TIED = {
    "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
    "cls.predictions.decoder.bias": "cls.predictions.bias",
}
HF_TIED = {
    "BertForMaskedLM": _MLM_TIED,
    "BertForPreTraining": _MLM_TIED,
    "GPT2LMHeadModel": {"lm_head.weight": "transformer.wte.weight"},
    "ModernBertForMaskedLM": {"decoder.weight": "model.embeddings.tok_embeddings.weight"},
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
    if hf.get("model_type") in ("llama", "mistral", "qwen2"):
        return _llama_config(hf)
    if hf.get("model_type") == "modernbert":
        return modernbert_config(hf)
    raise ValueError(
        f"model_type={hf.get('model_type')!r} is not supported; use a BERT, GPT-2, Llama, "
        "Mistral, Qwen2 or ModernBERT checkpoint"
    )


ROPE_TYPES = {"default": RopeScaling.none, "linear": RopeScaling.linear,
              "dynamic": RopeScaling.dynamic, "llama3": RopeScaling.llama3}  # fmt: skip


def _llama_config(hf: dict) -> ModelConfig:
    """A Llama / Mistral / Qwen2 config.json as a GPT-family ModelConfig (Qwen2: biases on the
    query, key and value projections); a shape tpformer does not build (other biases, another
    activation or head size, a sliding window, another RoPE) is refused by name."""
    kind = hf["model_type"]
    heads, hidden = hf["num_attention_heads"], hf["hidden_size"]
    refuse = []
    if hf.get("attention_bias") or hf.get("mlp_bias"):
        refuse.append("attention_bias / mlp_bias (tpformer's Llama has no biases)")
    window = hf.get("use_sliding_window", True) and hf.get("sliding_window") is not None
    if hf.get("hidden_act", "silu") != "silu":
        refuse.append(f"hidden_act={hf['hidden_act']!r} (only silu: SwiGLU)")
    if hf.get("head_dim") not in (None, hidden // heads):
        refuse.append(f"head_dim={hf['head_dim']} (only hidden_size / num_attention_heads)")
    if window:  # Mistral's; Qwen2's only with use_sliding_window
        refuse.append(f"sliding_window={hf['sliding_window']} (only full attention)")
    rope = hf.get("rope_parameters") or {
        **(hf.get("rope_scaling") or {}),
        "rope_theta": hf.get("rope_theta", 10000.0),
    }
    rope_type = rope.get("rope_type") or rope.get("type") or "default"
    if rope_type not in ROPE_TYPES:
        refuse.append(f"rope_type={rope_type!r} (supported: {sorted(ROPE_TYPES)})")
    if refuse:
        raise ValueError(f"this {kind} checkpoint is not supported: " + "; ".join(refuse))
    scaling = ROPE_TYPES[rope_type]
    original = int(rope.get("original_max_position_embeddings") or 0)
    longest = hf["max_position_embeddings"]
    if scaling == RopeScaling.dynamic:  # HF grows the base past the trained context
        original, longest = original or longest, int(longest * rope.get("factor", 1.0))
    return ModelConfig(
        arch=Arch.gpt,
        vocab_size=hf["vocab_size"],
        hidden_size=hidden,
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        intermediate_size=hf["intermediate_size"],
        max_position_embeddings=longest,
        type_vocab_size=0,
        dropout=0.0,
        attention_dropout=hf.get("attention_dropout", 0.0),
        activation=Activation.silu,
        gated_mlp=True,
        norm=Norm.rmsnorm,
        layer_norm_eps=hf.get("rms_norm_eps", 1e-6),
        bias=False,
        qkv_bias=kind == "qwen2",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        position_embedding=PositionEmbedding.rope,
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        rope_scaling=scaling,
        rope_factor=float(rope.get("factor", 1.0)),
        rope_original_max_positions=original,
        rope_low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
        rope_high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
        init_std=hf.get("initializer_range", 0.02),
    )


def llama_export_problems(config: ModelConfig) -> list[str]:
    """The keys of a GPT-family config with rotary positions that LlamaForCausalLM cannot hold."""
    wrong = {
        "model.norm": (config.norm, "rmsnorm"),
        "model.activation": (config.activation, "silu"),
        "model.gated_mlp": (config.gated_mlp, True),
        "model.bias": (config.bias, False),
    }
    return [f"{key}={have} (Llama: {want})" for key, (have, want) in wrong.items() if have != want]


def hf_config_from_model(config: ModelConfig, architecture: str, **extra: Any) -> Any:
    """A transformers config object for `config` (used by export)."""
    from transformers import BertConfig, GPT2Config

    if hf_family(config) == "llama":
        return _llama_hf_config(config, architecture, **extra)
    if hf_family(config) == "modernbert":
        return modernbert_hf_config(config, architecture, **extra)

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


def _llama_hf_config(config: ModelConfig, architecture: str, **extra: Any) -> Any:
    """A transformers LlamaConfig (Qwen2Config with qkv_bias) for a GPT-family config with
    Llama's blocks."""
    from transformers import LlamaConfig, Qwen2Config

    problems = llama_export_problems(config)
    if problems:
        raise ValueError("cannot export as LlamaForCausalLM: " + "; ".join(problems))
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": config.rope_theta}
    longest = config.max_position_embeddings
    if config.rope_scaling != "none":
        rope.update(rope_type=str(config.rope_scaling), factor=config.rope_factor)
    if config.rope_scaling == "llama3":
        rope.update(
            low_freq_factor=config.rope_low_freq_factor,
            high_freq_factor=config.rope_high_freq_factor,
            original_max_position_embeddings=config.rope_original_max_positions or longest,
        )
    if config.rope_scaling == "dynamic":
        longest = config.rope_original_max_positions or longest
    kind = Qwen2Config if config.qkv_bias else LlamaConfig
    return kind(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.kv_heads,
        max_position_embeddings=longest,
        rms_norm_eps=config.layer_norm_eps,
        tie_word_embeddings=config.tie_embeddings,
        attention_dropout=config.attention_dropout,
        initializer_range=config.init_std,
        rope_parameters=rope,
        architectures=[architecture],
        **extra,
    )
