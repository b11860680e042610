"""The model families as units (tpformer/config/families/, tpformer/interop/families/): each
preset belongs to one family and is recognized as it, each family's rules refuse the keys of
the others by name, and each family has one Hugging Face adapter whose classes cover every
task its model builds, both ways. A new family passes these by adding its two files."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpformer.config.families import FAMILIES, family_named, family_of
from tpformer.config.presets import PRESETS
from tpformer.config.rules.model import validate_model
from tpformer.config.schema import (
    ClassifierPooling,
    LocalAttentionConfig,
    NormConfig,
    NormPosition,
    Pooler,
)
from tpformer.interop.families import ADAPTERS, SUPPORTED, adapter_for, adapter_of
from tpformer.models import TASKS


def test_every_preset_is_one_family_s_and_recognized_as_it() -> None:
    assert list(PRESETS) == [name for f in FAMILIES for name in f.presets]
    for family in FAMILIES:
        assert family.presets, family.name
        for name, config in family.presets.items():
            assert family_of(config) is family, name
            validate_model(config, 1)  # each preset passes its family's rules
    assert len({f.name for f in FAMILIES}) == len(FAMILIES)
    assert family_named("llama") is family_of(PRESETS["llama3_8b"])
    with pytest.raises(ValueError, match=r"unknown model family 'qwen3'; known: \['bert'"):
        family_named("qwen3")


@pytest.mark.parametrize(
    ("preset", "keys", "message"),
    [
        ("bert_tiny", {"tie_embeddings": False}, "model.tie_embeddings=false is built for"),
        ("modernbert_tiny", {"tie_embeddings": False}, "BERT's MLM head is tied"),
        ("bert_tiny", {"classifier_pooling": ClassifierPooling.mean},
         "model.classifier_pooling=mean needs model.pooler=head"),
        ("gpt2_small", {"local_attention": LocalAttentionConfig(window=8)},
         r"model.local_attention \(window 8\) is built for arch=bert"),
        ("llama_tiny", {"local_attention": LocalAttentionConfig(window=8)},
         "a decoder's sliding window .Mistral. is not built"),
        ("gpt2_small", {"pooler": Pooler.head}, "are encoder .arch=bert. keys"),
        ("llama_tiny", {"norm": NormConfig(position=NormPosition.post)},
         "model.norm.position=post: a decoder .arch=gpt. is built pre-norm only"),
        ("gpt2_small", {"classifier_pooling": ClassifierPooling.mean}, "are encoder"),
    ],
)  # fmt: skip
def test_a_family_refuses_the_keys_of_the_others_by_name(
    preset: str, keys: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        validate_model(replace(PRESETS[preset], **keys), 1)


def test_every_family_has_one_adapter_covering_its_model_s_tasks_both_ways() -> None:
    assert sorted(a.family.name for a in ADAPTERS) == sorted(f.name for f in FAMILIES)
    for adapter in ADAPTERS:
        family = adapter.family
        config = next(iter(family.presets.values()))
        assert adapter_of(config) is adapter
        tasks = [task for arch, task in TASKS if arch == family.arch]
        for task in tasks:  # export names a class that reads back as the same task
            exported = adapter.export_class(config, task)
            assert SUPPORTED[exported] == adapter.classes[exported] == task, (family.name, task)
        assert set(adapter.classes.values()) <= set(tasks)
        for model_type, default in adapter.defaults.items():  # read: model_type -> adapter
            assert adapter_for({"model_type": model_type}) is adapter
            assert default in adapter.classes
    with pytest.raises(ValueError, match=r"a gpt2 model with task 'classification' has no"):
        adapter_of(PRESETS["gpt2_small"]).export_class(PRESETS["gpt2_small"], "classification")
    with pytest.raises(ValueError, match=r"model_type='qwen3' is not supported; supported: "):
        adapter_for({"model_type": "qwen3"})


def test_qwen2_is_a_llama_flavor_exported_under_its_own_class() -> None:
    llama = PRESETS["llama_tiny"]
    adapter = adapter_of(llama)
    assert adapter.export_class(llama, "causal_lm") == "LlamaForCausalLM"
    assert adapter.export_class(replace(llama, qkv_bias=True), "base") == "Qwen2Model"
    assert adapter_for({"model_type": "mistral"}) is adapter_for({"model_type": "qwen2"}) is adapter


@pytest.mark.parametrize(
    ("preset", "keys", "message"),
    [
        ("bert_tiny", {"norm": NormConfig(position=NormPosition.pre)},
         r"cannot export as BERT: model.norm.position=pre \(BERT: post\)"),
        ("bert_tiny", {"num_kv_heads": 1}, r"model.num_kv_heads=1 \(BERT: 2\)"),
        ("gpt2_small", {"tie_embeddings": False}, r"cannot export as GPT-2: model.tie_embeddings"),
        ("llama_tiny", {"bias": True}, r"cannot export as LlamaForCausalLM: model.bias=True"),
        ("modernbert_tiny", {"qkv_bias": True}, r"cannot export as ModernBERT: model.qkv_bias"),
    ],
)  # fmt: skip
def test_an_export_refuses_by_name_what_the_hf_class_cannot_hold(
    preset: str, keys: dict, message: str
) -> None:
    """Each family's config_to_hf: a key its Hugging Face class has no place for is named,
    not dropped (a pre-norm BERT exported as BertForPreTraining would load as another model)."""
    config = replace(PRESETS[preset], **keys)
    with pytest.raises(ValueError, match=message):
        adapter_of(config).config_to_hf(config, "X")
