"""ModernBERT (pre-norm without biases, GeGLU, rotary positions with a global and a local base,
sliding-window attention in all but every third layer, an MLM-only head and a pooled
classifier) as options of the BERT encoder: Hugging Face `ModernBertForMaskedLM` and
`ModernBertForSequenceClassification` checkpoints written by save_pretrained load at TP=1, 2
and 4 with HF's logits and export back unchanged; refused shapes and layouts are named; a
model fine-tuned by tpformer-finetune and exported predicts like tpformer."""

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers

from tests.cli.forked import run_script
from tests.dist import run_distributed
from tests.docs.commands import arguments, documented
from tests.tolerances import assert_rel_close
from tests.train.test_finetune import WORDS, _cli, write_sst2
from tests.train.test_trainer import QUIET, REPO
from tpformer.config.presets import preset
from tpformer.data.tokenizer import SPECIAL_TOKENS
from tpformer.interop.families import model_config_from_hf
from tpformer.interop.hf import load_hf_model, save_hf_checkpoint
from tpformer.parallel.comm import gather_from_tp
from tpformer.parallel.context import ParallelContext

HF_REL = 1e-5
"""fp32, the same math as HF (as tests/models/test_hf.py): kernels and reduction order differ."""
VOCAB = 99


def _hf_config(pooling: str = "mean", **keys: object) -> transformers.ModernBertConfig:
    """4 layers (0 and 3 global), a window of 8 (4 positions either side of the batch's 24),
    rope bases 1,000 (global) and 50 (local), 3 labels."""
    fields = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "max_position_embeddings": 64,
        "local_attention": 8,
        "global_rope_theta": 1000.0,
        "local_rope_theta": 50.0,
        "pad_token_id": 0,
        "bos_token_id": 2,
        "eos_token_id": 3,
        "cls_token_id": 2,
        "sep_token_id": 3,
        "classifier_pooling": pooling,
        "num_labels": 3,
        "attn_implementation": "sdpa",
        **keys,
    }
    return transformers.ModernBertConfig(**fields)


def _random(model: torch.nn.Module) -> torch.nn.Module:
    """LayerNorm weights start at one: make every tensor count."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.randint(4, VOCAB, (3, 24), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 24, dtype=torch.long)
    mask[1, 17:] = 0
    return ids, mask


def _load_compare_export(ctx: ParallelContext, source: str, target: str) -> torch.Tensor:
    model = load_hf_model(source, ctx).eval()
    save_hf_checkpoint(model, ctx, target)
    ids, mask = _batch()
    with torch.no_grad():
        out = model(ids, attention_mask=mask)
    if hasattr(out, "mlm_logits"):
        return gather_from_tp(out.mlm_logits, ctx.tp)[..., :VOCAB]
    return out.logits


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("world", "task", "pooling", "sequence_parallel"),
    [
        (1, "mlm", "mean", False),
        (2, "mlm", "mean", True),
        (4, "mlm", "mean", False),
        (2, "classification", "mean", True),
        (4, "classification", "cls", False),
    ],
)
def test_a_modernbert_checkpoint_loads_with_hf_logits_and_exports_back(
    tmp_path: Path, world: int, task: str, pooling: str, sequence_parallel: bool
) -> None:
    """TP=1/2/4, with sequence parallelism at 2; the MLM head, and the classifier over the
    mean of the tokens (a padded row) or the first token."""
    kind = {"mlm": transformers.ModernBertForMaskedLM}.get(
        task, transformers.ModernBertForSequenceClassification
    )
    hf = _random(kind(_hf_config(pooling)))
    hf.save_pretrained(tmp_path / "hf")
    ids, mask = _batch()
    with torch.no_grad():
        expected = hf(input_ids=ids, attention_mask=mask).logits
        unwindowed = kind(_hf_config(pooling, local_attention=64))
        unwindowed.load_state_dict(hf.state_dict())
        assert (
            unwindowed.eval()(input_ids=ids, attention_mask=mask).logits - expected
        ).abs().max() > 1e-3
    exported = tmp_path / "exported"
    for out in run_distributed(
        _load_compare_export,
        world,
        str(tmp_path / "hf"),
        str(exported),
        tensor=world,
        sequence_parallel=sequence_parallel,
    ):
        assert_rel_close(out, expected, HF_REL, f"modernbert {task} logits")
    reloaded = kind.from_pretrained(exported).state_dict()
    for key, tensor in hf.state_dict().items():
        assert torch.equal(reloaded[key], tensor), key


def test_the_published_shape_maps_to_the_modernbert_base_preset() -> None:
    """ModernBertConfig's defaults are answerdotai/ModernBERT-base's shape; the checkpoint's
    config.json says mean pooling."""
    hf = transformers.ModernBertConfig(classifier_pooling="mean").to_dict()
    assert model_config_from_hf(hf) == preset("modernbert_base")


@pytest.mark.parametrize(
    ("keys", "named"),
    [
        ({"mlp_bias": True}, "'mlp_bias': True"),
        ({"hidden_activation": "relu"}, "hidden_activation='relu'"),
        (
            {
                "layer_types": [
                    "full_attention",
                    "full_attention",
                    "sliding_attention",
                    "full_attention",
                ]
            },
            "layer_types=",
        ),
        ({"decoder_bias": False}, "decoder_bias=false"),
    ],
)
def test_a_modernbert_shape_tpformer_does_not_build_is_refused_by_name(
    keys: dict, named: str
) -> None:
    hf = {**_hf_config().to_dict(), **keys}
    with pytest.raises(ValueError, match="not supported") as refused:
        model_config_from_hf(hf)
    assert named in str(refused.value)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["data.sentence_pairs=nsp"], "model.pooler=head has no pair head"),
        (["model=bert_tiny", "data.sentence_pairs=none"], "data.sentence_pairs=none trains no"),
        (
            ["model=gpt2_small", "+model/local_attention=on"],
            "model.local_attention .window 128. is built for",
        ),
        (["model.pooler=tanh", "data.sentence_pairs=nsp"], "classifier_pooling=mean needs"),
    ],
)
def test_a_layout_or_recipe_modernbert_cannot_run_is_refused_before_start(
    overrides: list[str], named: str
) -> None:
    from tests.config.test_config import compose_config
    from tpformer.config.validate import validate
    from tpformer.parallel.layout import Layout

    config = compose_config("model=modernbert_tiny", "data.sentence_pairs=none", *overrides)
    with pytest.raises(ValueError, match=named):
        validate(config, Layout(dp=1, tp=1))


@pytest.mark.parametrize(
    ("overrides", "pairs"),
    [
        (["model=modernbert_tiny"], "none"),
        (["model=bert_tiny"], "nsp"),
        (["model=bert_tiny", "data.sentence_pairs=sop"], "sop"),
        (["model=modernbert_tiny", "model.pooler=tanh", "model.classifier_pooling=cls"], "nsp"),
    ],
)
def test_a_preset_brings_its_pair_recipe(overrides: list[str], pairs: str) -> None:
    """data.sentence_pairs=auto (the default): ModernBERT's preset runs as given, MLM only;
    BERT's keeps NSP; an explicit choice is the user's."""
    from tests.config.test_config import compose_config
    from tpformer.config.validate import validate
    from tpformer.parallel.layout import Layout

    config = compose_config(*overrides)
    validate(config, Layout(dp=1, tp=1))
    assert config.data.sentence_pairs == pairs


def _hf_modernbert_with_vocab(directory: Path) -> Path:
    """A tiny random ModernBertForMaskedLM with a WordPiece vocab.txt (the test sentences'
    words)."""
    vocab = [*SPECIAL_TOKENS, *WORDS]
    ids = {t: vocab.index(t) for t in ("[PAD]", "[CLS]", "[SEP]")}
    config = _hf_config(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=48, max_position_embeddings=64,
        pad_token_id=ids["[PAD]"], bos_token_id=ids["[CLS]"], cls_token_id=ids["[CLS]"],
        eos_token_id=ids["[SEP]"], sep_token_id=ids["[SEP]"], num_labels=2,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.ModernBertForMaskedLM(config).save_pretrained(directory)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return directory


SETTINGS = ["task=sst2", "parallel.tensor=2", "launcher.nproc_per_node=2", "optim.lr=2e-3",
            "trainer.epochs=2", "trainer.batch_size=16", "trainer.progress=false",
            *QUIET]  # fmt: skip


@pytest.mark.slow  # over ~5 s: the slow tier
def test_a_modernbert_finetuned_at_tp2_and_exported_predicts_like_tpformer(
    tmp_path: Path,
) -> None:
    """tpformer-finetune from a ModernBertForMaskedLM directory at TP=2 (the classifier head
    starts from the MLM head, as HF's from_pretrained does), then tpformer-convert to-hf: the
    ModernBertForSequenceClassification it writes predicts the test rows as tpformer did."""
    hf = _hf_modernbert_with_vocab(tmp_path / "hf")
    glue = write_sst2(tmp_path / "glue", train=64, dev=16)
    run = tmp_path / "run"
    _, finetune = arguments(  # docs/modernbert.md's commands with this test's files
        documented("tpformer-finetune task=sst2 init=path/to/modernbert"),
        {"path/to/modernbert": str(hf), "data.glue_dir=glue": f"data.glue_dir={glue}"},
    )
    result = _cli(
        [
            *finetune,
            f"data.cache_dir={tmp_path}",
            "optim.lr=2e-3",
            "trainer.epochs=2",
            "trainer.batch_size=16",
            "trainer.progress=false",
            *QUIET,
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    best = run / "best" / f"step{results['best']['step']:08d}"
    out = tmp_path / "exported"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    converted = run_script(
        "tpformer.cli.convert", arguments(
            documented("tpformer-convert to-hf runs/sst2/best/step00000630 hf/modernbert-sst2"),
            {"runs/sst2/best/step00000630": str(best), "hf/modernbert-sst2": str(out)},
        )[1],
        cwd=tmp_path, env=env, timeout=300,
    )  # fmt: skip
    assert converted.returncode == 0, converted.stderr[-2000:]
    model, info = transformers.ModernBertForSequenceClassification.from_pretrained(
        out, output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    rows = [line.split("\t")[1] for line in (glue / "SST-2" / "test.tsv").read_text().splitlines()]
    encoded = tokenizer(rows[1:], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model.eval()(
            input_ids=encoded["input_ids"], attention_mask=encoded["attention_mask"]
        ).logits
    ours = [line.split("\t")[1] for line in (run / "predictions" / "SST-2.tsv").read_text().split(
        "\n")[1:] if line]  # fmt: skip
    assert [model.config.id2label[int(i)] for i in logits.argmax(-1)] == ours


def test_a_pretraining_config_of_the_preset_builds_without_nsp() -> None:
    """modernbert_tiny's MLM-only recipe: no pooler, no pair head; the classifier's pool head."""
    from tpformer.models import build_model

    config = replace(preset("modernbert_tiny"), vocab_size=VOCAB)
    ctx = ParallelContext.single(device="cpu")
    names = {n for n, _ in build_model(config, ctx, task="pretraining").named_parameters()}
    assert not any("nsp" in n or "pooler" in n for n in names), names
    assert "bert.final_norm.weight" in names
