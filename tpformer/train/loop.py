"""Trainer: builds model, recomputation and engine from a Config, then drives the steps.

Per step: for each micro-batch, key the dropout masks by (step, first global sample), forward,
and backward a loss normalized by the *global* number of predicted tokens (so every layout
optimizes the same objective); then the engine reduces, clips and updates.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from pathlib import Path

import torch
from tqdm import tqdm

from tpformer.checkpoint import store
from tpformer.config.schema import Config
from tpformer.data import load_pretraining_data, prepare_data
from tpformer.data.loader import micro_batch_ranges
from tpformer.data.tokenizer import Tokenizer
from tpformer.engine import parallelize
from tpformer.models import build_model
from tpformer.parallel.comm import all_reduce, broadcast_object
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import logical_shape
from tpformer.train.metrics import MetricsWriter, flops_per_step, peak_tflops
from tpformer.train.plan import format_plan
from tpformer.train.schedule import lr_at, scaled_lr

log = logging.getLogger(__name__)


class Trainer:
    def __init__(self, config: Config, ctx: ParallelContext, run_dir: Path) -> None:
        self.config, self.ctx, self.run_dir = config, ctx, run_dir
        m = config.model
        self.task = "pretraining" if m.arch == "bert" else "causal_lm"
        prepared = self._prepare_data()  # first: a bad corpus or tokenizer fails before any build
        self.tokenizer_files = Tokenizer(prepared[0]).files if prepared else []
        self.data = load_pretraining_data(config.data, m, seed=config.parallel.seed,
                                          prepared=prepared)
        self.model = build_model(m, ctx, task=self.task)
        self.params_per_rank = sum(p.numel() for p in self.model.parameters())
        self.total_params = sum(logical_shape(p).numel() for p in self.model.parameters())
        wrapped = parallelize(self.model, config.parallel, config.optim, ctx)
        self.engine, self.checkpointed = wrapped.engine, wrapped.recomputed
        t = config.trainer
        self.global_batch = t.micro_batch_size * t.grad_accum * ctx.dp.size
        self.peak_lr = scaled_lr(config.optim, self.global_batch)
        self.metrics = MetricsWriter(run_dir, enabled=ctx.is_main)

    def _prepare_data(self) -> tuple[Path, Path] | None:
        """Rank 0 trains the tokenizer and preprocesses the corpus (or finds them cached); every
        rank gets the paths, or rank 0's error, so no rank is left waiting."""
        c = self.config
        if c.data.source == "synthetic":
            return None
        outcome: object = None
        if self.ctx.is_main:
            try:
                outcome = prepare_data(c.data, c.model.vocab_size, progress=c.trainer.progress)
            except Exception as err:
                outcome = (type(err).__name__, str(err))
                broadcast_object(outcome)
                raise
        outcome = broadcast_object(outcome)
        if isinstance(outcome, tuple) and isinstance(outcome[0], str):
            raise RuntimeError(f"rank 0 could not prepare the data: {outcome[0]}: {outcome[1]}")
        return outcome  # type: ignore[return-value]

    def plan(self) -> str:
        return format_plan(self.config, self.ctx.layout, self.params_per_rank, self.total_params,
                           self.checkpointed)

    # ------------------------------------------------------------------ checkpoints

    @property
    def checkpoint_root(self) -> Path:
        return self.run_dir / "checkpoints"

    def save(self, step: int) -> Path:
        """Logical (layout-free) engine state, written by the ranks together through DCP."""
        state = {"engine": self.engine, f"rng_rank{self.ctx.rank}": store.rng_state()}
        return store.save(self.checkpoint_root, step, state, self.ctx,
                          meta=store.checkpoint_meta(self.config, self.ctx),
                          keep_last=self.config.trainer.keep_last,
                          tokenizer_files=self.tokenizer_files)

    def resume(self) -> int:
        """Load trainer.resume at this run's layout; returns the step to continue from."""
        choice = self.config.trainer.resume
        if choice == "none":
            return 0
        directory = store.find_latest(self.checkpoint_root) if choice == "auto" else Path(choice)
        if directory is None:
            log.info("trainer.resume=auto: no complete checkpoint in %s, starting at step 0",
                     self.checkpoint_root)
            return 0
        meta = store.read_meta(directory)
        mismatched = store.model_mismatches(meta, self.config)
        if mismatched:
            details = ", ".join(f"{k}: checkpoint {a} vs run {b}" for k, (a, b) in mismatched.items())
            raise ValueError(f"{directory} holds another model ({details})")
        same_world = meta.get("world_size") == self.ctx.layout.world_size
        template: dict[str, object] = {"engine": self.engine}
        if same_world:  # per-rank RNG states only mean something for the same ranks
            template[f"rng_rank{self.ctx.rank}"] = store.rng_state()
        store.load(directory, template)
        if same_world:
            torch.set_rng_state(template[f"rng_rank{self.ctx.rank}"]["cpu"])  # type: ignore[index]
        now = store.checkpoint_meta(self.config, self.ctx)
        changed = {k: (meta.get(k), now[k]) for k in ("world_size", "tensor", "data", "zero_stage",
                                                       "precision") if meta.get(k) != now[k]}
        log.info("resumed from %s at step %d%s", directory, meta["step"],
                 f", resharded {changed}" if changed else "")
        return int(meta["step"])  # type: ignore[arg-type]

    def _install_sigterm(self) -> None:
        """SIGTERM (preemption) asks for a checkpoint and a clean exit after the current step."""
        self._sigterm = False
        if threading.current_thread() is threading.main_thread():
            def request_stop(signum: int, frame: object) -> None:
                self._sigterm = True
            signal.signal(signal.SIGTERM, request_stop)

    def _stop_requested(self) -> bool:
        """True on every rank as soon as any rank got SIGTERM (one tiny all-reduce per step)."""
        flag = torch.tensor([1.0 if self._sigterm else 0.0], device=self.ctx.device)
        all_reduce(flag, self.ctx.tp, torch.distributed.ReduceOp.MAX)
        all_reduce(flag, self.ctx.dp, torch.distributed.ReduceOp.MAX)
        return bool(flag.item())

    def _to_device(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {k: v.to(self.ctx.device, non_blocking=True) for k, v in batch.items()}

    def _denominator(self, batches: list[dict[str, torch.Tensor]]) -> float:
        """Predicted tokens in the whole global batch (one small all-reduce over DP)."""
        if self.task == "causal_lm":
            local = sum(b["input_ids"].shape[0] * (b["input_ids"].shape[1] - 1) for b in batches)
        else:
            local = sum(int((b["mlm_labels"] != -100).sum()) for b in batches)
        count = torch.tensor([float(local)], dtype=torch.float64, device=self.ctx.device)
        return float(all_reduce(count, self.ctx.dp).item())

    def _losses(self, batch: dict[str, torch.Tensor], denominator: float) -> list[torch.Tensor]:
        """This micro-batch's shares of the global-batch losses: [total] or [total, mlm, nsp]."""
        if self.task == "causal_lm":
            out = self.model(batch["input_ids"], labels=batch["input_ids"])
            tokens = batch["input_ids"].shape[0] * (batch["input_ids"].shape[1] - 1)
            return [out.loss * (tokens / denominator)]
        out = self.model(**batch)
        mlm = out.mlm_loss_sum / denominator
        nsp = out.nsp_loss * batch["input_ids"].shape[0] / self.global_batch
        return [mlm + nsp, mlm, nsp]

    def _run_step(self, step: int, *, train: bool) -> dict[str, float]:
        t = self.config.trainer
        ranges = micro_batch_ranges(step, micro_batch_size=t.micro_batch_size,
                                    grad_accum=t.grad_accum, dp_size=self.ctx.dp.size,
                                    dp_rank=self.ctx.dp.rank)
        split = "train" if train else "eval"
        batches = [self._to_device(self.data.batch(r, split=split)) for r in ranges]
        denominator = self._denominator(batches)
        names = ["loss"] if self.task == "causal_lm" else ["loss", "mlm_loss", "nsp_loss"]
        totals = torch.zeros(len(names), dtype=torch.float64, device=self.ctx.device)
        for i, (r, batch) in enumerate(zip(ranges, batches)):
            self.ctx.rng.set_position(step, r.start)
            with torch.set_grad_enabled(train):
                losses = self._losses(batch, denominator)
            if train:  # the engine averages gradients over DP; this is a share of the global sum
                self.engine.backward(losses[0] * self.ctx.dp.size, sync=i == len(batches) - 1)
            totals += torch.stack([x.detach().double() for x in losses])
        return dict(zip(names, all_reduce(totals, self.ctx.dp).tolist()))

    def evaluate(self, step: int) -> float:
        self.model.eval()
        with self.engine.gathered():
            parts = [self._run_step(i, train=False) for i in range(self.config.trainer.eval_steps)]
        self.model.train()
        record = {k: sum(p[k] for p in parts) / len(parts) for k in parts[0]}
        self.metrics.log({"step": step, "eval": True, **record})
        log.info("eval at step %d: %s", step, ", ".join(f"{k} {v:.4f}" for k, v in record.items()))
        return record["loss"]

    def train(self) -> list[dict]:
        """Run to trainer.max_steps (or the time limit); returns the logged records."""
        t, c = self.config.trainer, self.config
        seq = c.data.seq_length
        tokens_per_step = self.global_batch * seq
        head_tokens = (self.global_batch * seq if self.task == "causal_lm"
                       else int(self.global_batch * seq * c.data.mask_prob))
        flops = flops_per_step(c.model, samples=self.global_batch, seq=seq, head_tokens=head_tokens)
        peak = peak_tflops(t.peak_tflops, c.parallel.precision)
        records: list[dict] = []
        window: list[dict[str, float]] = []
        start = last = time.perf_counter()
        self.model.train()
        self._install_sigterm()
        first = self.resume()
        bar = tqdm(total=t.max_steps, initial=first, disable=not (self.ctx.is_main and t.progress),
                   desc="train", dynamic_ncols=True)
        step = first - 1
        for step in range(first, t.max_steps):
            lr = lr_at(step, peak=self.peak_lr, optim=c.optim, max_steps=t.max_steps)
            self.engine.set_lr(lr)
            losses = self._run_step(step, train=True)
            result = self.engine.step()
            window.append(losses)
            done = step + 1 == t.max_steps
            timed_out = t.max_time_minutes > 0 and time.perf_counter() - start > 60 * t.max_time_minutes
            if (step + 1) % t.log_every == 0 or done or timed_out or step == 0:
                now = time.perf_counter()
                step_time = (now - last) / len(window)
                tflops = flops / step_time / 1e12 / self.ctx.layout.world_size
                record = {"step": step + 1,
                          **{k: sum(w[k] for w in window) / len(window) for k in window[0]}, "lr": lr,
                          "grad_norm": result["grad_norm"], "skipped": result["skipped"],
                          "tokens_per_s": tokens_per_step / step_time,
                          "tflops_per_device": tflops}
                if peak > 0:
                    record["mfu"] = tflops / peak
                records.append(record)
                self.metrics.log(record)
                bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{lr:.2e}",
                                tok_s=f"{record['tokens_per_s']:.0f}", tflops=f"{tflops:.3f}",
                                **({"mfu": f"{record['mfu']:.1%}"} if peak > 0 else {}))
                window, last = [], now
            bar.update(1)
            preempted = self._stop_requested()
            if preempted or (t.exit_at_step and step + 1 == t.exit_at_step):
                self.save(step + 1)
                log.info("%s: saved step %d and stopping",
                         "SIGTERM" if preempted else "trainer.exit_at_step", step + 1)
                bar.close()
                self.metrics.close()
                return records
            if t.save_every and (step + 1) % t.save_every == 0:
                self.save(step + 1)
            if t.eval_every and (step + 1) % t.eval_every == 0 and not done:
                self.evaluate(step + 1)
            if timed_out:
                log.info("trainer.max_time_minutes=%s reached at step %d", t.max_time_minutes, step + 1)
                break
        bar.close()
        self.evaluate(step + 1)
        self.metrics.close()
        return records
