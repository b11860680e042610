"""Fine-tuning computes what a plain `transformers` loop computes: the same weights (the
classifier head included, written by save_pretrained), the same batches in the same order,
dropout 0, torch.optim.AdamW with Trainer's decay groups, get_linear_schedule_with_warmup (10%
warmup, optim.warmup_style=transformers) and clip_grad_norm_. 50 steps, classification and
regression, TP=1 and TP=2: the losses of every step and the dev logits after training agree
within fp32 tolerance."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.data.test_glue import write_glue_file
from tests.dist import run_distributed
from tests.train.test_finetune import sentiment_rows, write_hf_bert
from tpformer.config.schema import (
    FinetuneConfig,
    FinetuneTrainerConfig,
    GlueDataConfig,
    OptimConfig,
)
from tpformer.data.glue.batches import prediction_batch
from tpformer.parallel.context import ParallelContext
from tpformer.train.finetuning import finetuning_trainer
from tpformer.train.loop import Trainer

TRAIN, DEV, BATCH, EPOCHS = 200, 24, 8, 2
STEPS = TRAIN // BATCH * EPOCHS  # 50
OPTIM = OptimConfig(
    lr=5e-3, warmup_ratio=0.1, warmup_style="transformers", weight_decay=0.01, eps=1e-8
)
WARMUP = math.ceil(0.1 * STEPS)  # what Trainer's get_warmup_steps makes of warmup_ratio 0.1

LOSS_REL = 1e-4
"""50 AdamW steps in fp32 on a 2-layer BERT: the two programs sum in different orders (fused
QKV, the fused optimizer, TP's split matmuls) and Adam carries the rounding forward, most
visibly once the loss is small; measured at most 2.5e-5 relative (sst2, TP=1 and TP=2), where
the same run with the warmup shifted by one step (optim.warmup_style=megatron) differs by
up to 0.47 (sst2) and 0.15 (stsb)."""
LOGITS_ABS = 1e-4
"""Dev logits after training, absolute (of order 1; measured at most 1.5e-5)."""


def _task_config(tmp_path: Path, task: str) -> FinetuneConfig:
    """sst2 (single sentences, 2 classes) or stsb (pairs scored 4.5 when the first sentence says
    "good", else 0.5)."""
    if task == "sst2":
        rows = sentiment_rows(TRAIN + DEV, 11)
        write_glue_file(tmp_path / "glue", "SST-2", "train", rows[:TRAIN])
        write_glue_file(tmp_path / "glue", "SST-2", "dev", rows[TRAIN:])
        num_labels = 2
    else:
        pairs = list(zip(sentiment_rows(TRAIN + DEV, 12), sentiment_rows(TRAIN + DEV, 13)))
        rows = [(a, b, f"{int(la) * 4 + 0.5:.2f}") for (a, _, la), (b, _, _) in pairs]
        write_glue_file(tmp_path / "glue", "STS-B", "train", rows[:TRAIN])
        write_glue_file(tmp_path / "glue", "STS-B", "dev", rows[TRAIN:])
        num_labels = 1
    return FinetuneConfig(
        task=task,
        init=str(write_hf_bert(tmp_path / "hf", dropout=0.0, num_labels=num_labels)),
        data=GlueDataConfig(glue_dir=str(tmp_path / "glue"), cache_dir=str(tmp_path / "cache")),
        optim=OPTIM,
        trainer=FinetuneTrainerConfig(
            epochs=EPOCHS, batch_size=BATCH, log_every=1, progress=False, loggers=[]
        ),
    )


def _dev_batch(trainer: Trainer) -> dict[str, torch.Tensor]:
    predictor = trainer.task.evaluator.predictor
    examples = predictor.splits["dev"]
    return prediction_batch(examples, list(range(len(examples))), predictor.pad_id)


def _tpformer(ctx: ParallelContext, config: FinetuneConfig, run_dir: str) -> tuple:
    """tpformer-finetune's trainer: every step's loss, the dev logits after training, and the
    training batches in the order the loop took them (for the reference)."""
    trainer = finetuning_trainer(config, ctx, Path(run_dir))
    records = trainer.train()
    losses = [r["loss"] for r in records if "loss" in r and not r.get("eval")]
    batches = [trainer.task.train_batches(step)[0][1] for step in range(STEPS)]
    trainer.model.eval()
    with trainer.engine.gathered(), torch.no_grad():
        logits = trainer.model(**_dev_batch(trainer)).logits
    return losses, logits, batches, _dev_batch(trainer)


def _transformers(hf_dir: str, batches: list[dict], dev: dict) -> tuple[list[float], torch.Tensor]:
    """The plain transformers loop a user writes (Trainer's decay groups: no decay on biases and
    LayerNorm weights)."""
    from transformers import BertForSequenceClassification, get_linear_schedule_with_warmup

    model = BertForSequenceClassification.from_pretrained(hf_dir).train()
    no_decay = [p for n, p in model.named_parameters() if "bias" in n or "LayerNorm" in n]
    decay = [p for n, p in model.named_parameters() if not ("bias" in n or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": OPTIM.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=OPTIM.lr,
        betas=(OPTIM.beta1, OPTIM.beta2),
        eps=OPTIM.eps,
    )
    schedule = get_linear_schedule_with_warmup(optimizer, WARMUP, len(batches))
    losses = []
    for batch in batches:
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM.clip_grad)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    with torch.no_grad():
        logits = model.eval()(**dev).logits
    return losses, logits


@pytest.mark.sweep
@pytest.mark.parametrize("task", ["sst2", "stsb"])
@pytest.mark.parametrize("tp", [1, 2])
def test_finetuning_follows_a_plain_transformers_loop(tmp_path: Path, task: str, tp: int) -> None:
    config = _task_config(tmp_path, task)
    if tp == 1:
        ours = _tpformer(ParallelContext.single(device="cpu"), config, str(tmp_path / "run"))
    else:
        ours = run_distributed(_tpformer, tp, config, str(tmp_path / "run"), tensor=tp)[0]
    losses, logits, batches, dev = ours
    assert len(losses) == STEPS == len(batches)
    want_losses, want_logits = _transformers(config.init, batches, dev)
    first, last = sum(want_losses[:10]), sum(want_losses[-10:])
    assert last < 0.8 * first, want_losses  # it learns: the comparison is not of idle steps
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, want_losses))
    assert worst < LOSS_REL, (worst, losses, want_losses)
    assert logits.shape == want_logits.shape
    assert (logits - want_logits).abs().max() < LOGITS_ABS, (logits, want_logits)
