"""Fine-tuning BertForSequenceClassification on a GLUE task at any layout.

Order: step s trains on positions [s x B, (s+1) x B) of an endless stream that visits the training
split once per epoch in an order seeded by (seed, epoch) -- never by the layout. DP rank r takes its
slice of the step's examples (sorted by length first with data.group_by_length) and cuts it into
micro-batches padded to their own longest row; the loss is the mean over the global batch. Dev is
evaluated after every epoch; the best epoch by the task's first metric is checkpointed and its test
predictions written in the GLUE submission format; results.json holds every evaluation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm import tqdm

from tpformer.checkpoint import store
from tpformer.convert import load_classifier
from tpformer.config.schema import FinetuneConfig
from tpformer.data.glue import GlueTask, get_task, load_split, score
from tpformer.data.pretraining import EpochOrder
from tpformer.data.tokenizer import Tokenizer
from tpformer.engine import build_engine
from tpformer.parallel.comm import all_gather_object
from tpformer.parallel.context import ParallelContext
from tpformer.train.schedule import lr_at

log = logging.getLogger(__name__)
SUBMISSION = {"cola": ["CoLA"], "sst2": ["SST-2"], "mrpc": ["MRPC"], "stsb": ["STS-B"],
              "qqp": ["QQP"], "mnli": ["MNLI-m", "MNLI-mm"], "qnli": ["QNLI"], "rte": ["RTE"],
              "wnli": ["WNLI"]}
"""File names of the GLUE benchmark's submission format, one per test split."""


def encode(tokenizer: Tokenizer, rows: dict[str, list], max_length: int) -> list[dict[str, list]]:
    """[CLS] a [SEP] (b [SEP]) per row, the longer segment truncated first."""
    a = tokenizer.encode(rows["text_a"])
    b = tokenizer.encode(rows["text_b"]) if rows["text_b"] is not None else [None] * len(a)
    examples = []
    for i, (x, y) in enumerate(zip(a, b)):
        room = max_length - (3 if y is not None else 2)
        x, y = list(x), list(y) if y is not None else None
        while len(x) + (len(y) if y is not None else 0) > room:
            if y is not None and len(y) > len(x):
                y.pop()
            else:
                x.pop()
        ids = [tokenizer.cls_id, *x, tokenizer.sep_id]
        types = [0] * len(ids)
        if y is not None:
            ids += [*y, tokenizer.sep_id]
            types += [1] * (len(y) + 1)
        example = {"input_ids": ids, "token_type_ids": types, "index": rows["index"][i]}
        if "label" in rows:
            example["label"] = rows["label"][i]
        examples.append(example)
    return examples


def collate(examples: list[dict], pad_id: int, regression: bool) -> dict[str, torch.Tensor]:
    """Pad to the longest row of this micro-batch, not to max_length."""
    width = max(len(e["input_ids"]) for e in examples)
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    types = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for row, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[row, :n] = torch.tensor(e["input_ids"])
        types[row, :n] = torch.tensor(e["token_type_ids"])
        mask[row, :n] = 1
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    if "label" in examples[0]:
        batch["labels"] = torch.tensor([e["label"] for e in examples],
                                       dtype=torch.float if regression else torch.long)
    return batch


class Finetuner:
    def __init__(self, config: FinetuneConfig, ctx: ParallelContext, run_dir: Path) -> None:
        self.config, self.ctx, self.run_dir = config, ctx, run_dir
        self.task: GlueTask = get_task(config.task)
        self.model, tokenizer_path = load_classifier(Path(config.init), ctx,
                                                     num_labels=self.task.num_labels)
        self.tokenizer = Tokenizer(tokenizer_path)
        self.tokenizer.check_vocab(self.model.config.vocab_size)
        self.splits = {split: self._examples(split)
                       for split in ("train", *self._dev_splits(), *self._test_splits())}
        self.engine = build_engine(self.model, config.optim, config.parallel, ctx)
        t, dp = config.trainer, ctx.dp.size
        self.micro = t.micro_batch_size or t.batch_size // dp
        self.accum = t.batch_size // (self.micro * dp)
        train = self.splits["train"]
        self.steps_per_epoch = math.ceil(len(train) / t.batch_size)
        self.max_steps = math.ceil(t.epochs * len(train) / t.batch_size)
        self.order = EpochOrder(len(train), config.parallel.seed)

    def _files(self) -> dict[str, str]:
        d = self.config.data
        return {"train": d.train_file, "dev": d.dev_file, "test": d.test_file}

    def _dev_splits(self) -> tuple[str, ...]:
        return self.task.dev_splits[:1] if self.config.data.dev_file else self.task.dev_splits

    def _test_splits(self) -> list[str]:
        if self.config.data.test_file:
            return list(self.task.test_splits[:1])
        if self.config.data.train_file or self.config.data.dev_file:
            return []
        if not self.config.data.glue_dir:
            return list(self.task.test_splits)
        folder = Path(self.config.data.glue_dir).expanduser() / self.task.directory
        return [s for s in self.task.test_splits if (folder / f"{s}.tsv").is_file()]

    def _examples(self, split: str) -> list[dict]:
        """Tokenized rows of a split, cached by file content, tokenizer and max_length."""
        d = self.config.data
        key = hashlib.sha256(repr((self.config.task, split, d.glue_dir, d.max_length,
                                   self.tokenizer.fingerprint())).encode())
        kind = "train" if split == "train" else "test" if split.startswith("test") else "dev"
        source = (Path(self._files()[kind]) if self._files()[kind]
                  else Path(d.glue_dir).expanduser() / self.task.directory / f"{split}.tsv")
        if source.is_file():  # a missing file fails in load_split, by name
            key.update(source.read_bytes())
        cache = Path(d.cache_dir).expanduser() / "glue" / f"{self.config.task}-{split}-{key.hexdigest()[:16]}.pt"
        if cache.is_file():
            return torch.load(cache)
        examples = encode(self.tokenizer, load_split(d.glue_dir, self.config.task, split,
                                                     self._files()), d.max_length)
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".tmp{self.ctx.rank}")
        torch.save(examples, tmp)
        tmp.replace(cache)
        return examples

    # ------------------------------------------------------------------ training

    def _step_examples(self, step: int) -> list[tuple[int, dict]]:
        """(slot, example) of this DP rank's slice of global batch `step`; slots are the step's
        stream positions in (length-sorted) batch order, so dropout keys follow the layout-free
        order of the global batch."""
        t = self.config.trainer
        train = self.splits["train"]
        positions = range(step * t.batch_size, (step + 1) * t.batch_size)
        chosen = [(p, train[self.order(p)]) for p in positions]
        if self.config.data.group_by_length:
            chosen.sort(key=lambda pe: (len(pe[1]["input_ids"]), pe[0]))
        slots = [(positions[j], e) for j, (_, e) in enumerate(chosen)]  # dropout keys follow slots
        per_rank = len(slots) // self.ctx.dp.size
        return slots[self.ctx.dp.rank * per_rank:(self.ctx.dp.rank + 1) * per_rank]

    def _train_step(self, step: int) -> float:
        t = self.config.trainer
        mine = self._step_examples(step)
        total = torch.zeros((), dtype=torch.float64)
        for m in range(self.accum):
            part = mine[m * self.micro:(m + 1) * self.micro]
            batch = {k: v.to(self.ctx.device) for k, v in
                     collate([e for _, e in part], self.tokenizer.pad_id,
                             self.task.labels is None).items()}
            self.ctx.rng.set_position(step, part[0][0])
            loss = self.model(**batch).loss * (len(part) / t.batch_size)
            self.engine.backward(loss * self.ctx.dp.size, sync=m == self.accum - 1)
            total += loss.detach().double()
        return float(torch.stack([torch.tensor(x) for x in
                                  all_gather_object(float(total), self.ctx.dp)]).sum())

    def predict(self, split: str) -> tuple[torch.Tensor, list[int]]:
        """Predictions (class ids, or scores for STS-B) of a whole split, DP ranks sharing it."""
        examples = self.splits[split]
        dp = self.ctx.dp
        per_rank = math.ceil(len(examples) / dp.size)
        mine = examples[dp.rank * per_rank:(dp.rank + 1) * per_rank]
        preds: list[float] = []
        self.model.eval()
        with torch.no_grad(), self.engine.gathered():
            for start in range(0, len(mine), self.micro):
                batch = collate(mine[start:start + self.micro], self.tokenizer.pad_id, False)
                batch.pop("labels", None)
                logits = self.model(**{k: v.to(self.ctx.device) for k, v in batch.items()}).logits
                out = logits.squeeze(-1) if self.task.labels is None else logits.argmax(-1)
                preds += out.float().cpu().tolist()
        self.model.train()
        gathered = [p for part in all_gather_object(preds, dp) for p in part]  # type: ignore[union-attr]
        return torch.tensor(gathered), [e["index"] for e in examples]

    def evaluate(self) -> dict[str, float]:
        metrics: dict[str, float] = {}
        dev_splits = self._dev_splits()
        for split in dev_splits:
            pred, _ = self.predict(split)
            gold = torch.tensor([e["label"] for e in self.splits[split]])
            prefix = "" if len(dev_splits) == 1 else f"{split.removeprefix('dev_')}_"
            metrics.update({prefix + k: v for k, v in score(self.config.task, pred, gold).items()})
        return metrics

    def write_predictions(self) -> None:
        """Test-set predictions in the GLUE submission format (index<TAB>prediction)."""
        out = self.run_dir / "predictions"
        test_splits = [s for s in self.task.test_splits if s in self.splits]
        for split, name in zip(test_splits, SUBMISSION[self.config.task]):
            pred, index = self.predict(split)
            if self.ctx.is_main:
                out.mkdir(exist_ok=True)
                if self.task.labels is None:
                    values = [f"{min(5.0, max(0.0, p)):.3f}" for p in pred.tolist()]
                else:
                    values = [self.task.labels[int(p)] for p in pred.tolist()]
                lines = ["index\tprediction", *(f"{i}\t{v}" for i, v in zip(index, values))]
                (out / f"{name}.tsv").write_text("\n".join(lines) + "\n")

    def save_best(self, step: int) -> Path:
        meta = {"step": step, "arch": "bert", "task": self.config.task,
                "num_labels": self.task.num_labels,
                "config": {"model": asdict(self.model.config), "finetune": asdict(self.config)}}
        for key in store.MODEL_KEYS:
            meta[key] = getattr(self.model.config, key)
        state = {"engine": self.engine}
        return store.save(self.run_dir / "checkpoints", step, state, self.ctx, meta=meta,
                          keep_last=1, tokenizer_files=self.tokenizer.files)

    def train(self) -> dict:
        """Run every epoch; returns (and writes to results.json) the evaluations and the best."""
        c, t = self.config, self.config.trainer
        warmup = c.optim.warmup_steps or round(t.warmup_ratio * self.max_steps)
        schedule = replace(c.optim, warmup_steps=warmup)
        dev_splits = self._dev_splits()
        main_metric = (self.task.metrics[0] if len(dev_splits) == 1
                       else f"{dev_splits[0].removeprefix('dev_')}_{self.task.metrics[0]}")
        results: dict = {"task": c.task, "init": c.init, "steps": self.max_steps,
                         "train_examples": len(self.splits["train"]), "evaluations": []}
        best = -math.inf
        start = time.perf_counter()
        bar = tqdm(total=self.max_steps, disable=not (self.ctx.is_main and t.progress),
                   desc=f"finetune {c.task}", dynamic_ncols=True)
        for step in range(self.max_steps):
            lr = lr_at(step, peak=c.optim.lr, optim=schedule, max_steps=self.max_steps)
            self.engine.set_lr(lr)
            loss = self._train_step(step)
            self.engine.step()
            bar.update(1)
            if (step + 1) % t.log_every == 0:
                bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}")
            if (step + 1) % self.steps_per_epoch == 0 or step + 1 == self.max_steps:
                metrics = self.evaluate()
                record = {"step": step + 1, "epoch": (step + 1) / self.steps_per_epoch,
                          "train_loss": loss, **metrics,
                          "wall_time_s": time.perf_counter() - start}
                results["evaluations"].append(record)
                log.info("dev at step %d: %s", step + 1,
                         ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
                if metrics[main_metric] > best:
                    best = metrics[main_metric]
                    results["best"] = record
                    self.save_best(step + 1)
                    self.write_predictions()
        bar.close()
        results["wall_time_s"] = time.perf_counter() - start
        if self.ctx.is_main:
            (self.run_dir / "results.json").write_text(json.dumps(results, indent=1))
        return results
