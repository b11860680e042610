"""The Llama family's Hugging Face adapter: Llama, Mistral and Qwen2 (Model, ForCausalLM).
HF keeps q, k and v apart (ours: one fused QKV, or with grouped-query attention a query and a
[head, (k, v), d] key/value weight) and gate_proj and up_proj apart (ours: [unit, (gate, up)]
rows). Qwen2 is Llama with biases on q, k and v (model.qkv_bias); Mistral is read without its
sliding window."""

from __future__ import annotations

from typing import Any

from tpformer.config.families.llama import LLAMA
from tpformer.config.schema import (
    Activation,
    Arch,
    MlpConfig,
    ModelConfig,
    Norm,
    NormConfig,
    NormPosition,
    RopeScaling,
    RotaryConfig,
)
from tpformer.interop.families.base import HFAdapter, export_class_of, mismatches
from tpformer.interop.hf_rules import FusedQKV, GatedRows, Plain, Rule

ROPE_TYPES = {"default": RopeScaling.none, "linear": RopeScaling.linear,
              "dynamic": RopeScaling.dynamic, "llama3": RopeScaling.llama3}  # fmt: skip


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


def llama_config(hf: dict) -> ModelConfig:
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
    rotary, longest = _rotary(rope, ROPE_TYPES[rope_type], hf["max_position_embeddings"])
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
        mlp=MlpConfig(activation=Activation.silu, gated=True),
        norm=NormConfig(
            kind=Norm.rmsnorm,
            eps=hf.get("rms_norm_eps", 1e-6),
            bias=False,
            position=NormPosition.pre,
        ),
        bias=False,
        qkv_bias=kind == "qwen2",
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
        rotary=rotary,
        init_std=hf.get("initializer_range", 0.02),
    )


def _rotary(rope: dict, scaling: RopeScaling, longest: int) -> tuple[RotaryConfig, int]:
    """The rotary group of HF's rope parameters, and the model's longest sequence: dynamic
    scaling's grows past the trained context (as HF does), which becomes the original one."""
    original = int(rope.get("original_max_position_embeddings") or 0)
    if scaling == RopeScaling.dynamic:
        original, longest = original or longest, int(longest * rope.get("factor", 1.0))
    rotary = RotaryConfig(
        theta=float(rope.get("rope_theta", 10000.0)),
        scaling=scaling,
        factor=float(rope.get("factor", 1.0)),
        original_max_positions=original,
        low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
        high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
    )
    return rotary, longest


def llama_export_problems(config: ModelConfig) -> list[str]:
    """The keys of a GPT-family config with rotary positions that LlamaForCausalLM cannot hold."""
    wrong = {
        "model.norm.kind": (config.norm.kind, "rmsnorm"),
        "model.mlp.activation": (config.mlp.activation, "silu"),
        "model.mlp.gated": (config.mlp.gated, True),
        "model.bias": (config.bias, False),
    }
    return mismatches(wrong, "Llama")


def llama_hf_config(config: ModelConfig, architecture: str, **extra: Any) -> Any:
    """A transformers LlamaConfig (Qwen2Config with qkv_bias) for a GPT-family config with
    Llama's blocks."""
    from transformers import LlamaConfig, Qwen2Config

    problems = llama_export_problems(config)
    r = config.rotary
    if problems or r is None:
        problems = problems or ["model.rotary=null (Llama: rotary positions)"]
        raise ValueError("cannot export as LlamaForCausalLM: " + "; ".join(problems))
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": r.theta}
    longest = config.max_position_embeddings
    if r.scaling != "none":
        rope.update(rope_type=str(r.scaling), factor=r.factor)
    if r.scaling == "llama3":
        rope.update(
            low_freq_factor=r.low_freq_factor,
            high_freq_factor=r.high_freq_factor,
            original_max_position_embeddings=r.original_max_positions or longest,
        )
    if r.scaling == "dynamic":
        longest = r.original_max_positions or longest
    kind = Qwen2Config if config.qkv_bias else LlamaConfig
    return kind(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.kv_heads,
        max_position_embeddings=longest,
        rms_norm_eps=config.norm.eps,
        tie_word_embeddings=config.tie_embeddings,
        attention_dropout=config.attention_dropout,
        initializer_range=config.init_std,
        rope_parameters=rope,
        architectures=[architecture],
        **extra,
    )


def llama_export_class(config: ModelConfig, task: str) -> str:
    """LlamaModel / LlamaForCausalLM, Qwen2's with model.qkv_bias."""
    kind = "Qwen2" if config.qkv_bias else "Llama"
    return export_class_of(
        {"base": f"{kind}Model", "causal_lm": f"{kind}ForCausalLM"}, "llama", task
    )


def llama_tied(config: ModelConfig, architecture: str) -> dict[str, str]:
    """The LM head, a copy of the word embedding when tied (model.tie_embeddings)."""
    tied = config.tie_embeddings and architecture.endswith("ForCausalLM")
    return {"lm_head.weight": "model.embed_tokens.weight"} if tied else {}


LLAMA_HF = HFAdapter(
    family=LLAMA,
    defaults={
        "llama": "LlamaForCausalLM",
        "mistral": "MistralForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
    },
    classes={
        f"{kind}{suffix}": task
        for kind in ("Llama", "Mistral", "Qwen2")
        for suffix, task in (("Model", "base"), ("ForCausalLM", "causal_lm"))
    },
    body_prefix="model.",
    key_map=llama_key_map,
    config_from_hf=llama_config,
    config_to_hf=llama_hf_config,
    export_class=llama_export_class,
    tied=llama_tied,
)
