"""StepLoader: the same steps whatever the worker count, and a failing worker ends the run with
its error instead of leaving the loop waiting."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tests.models.common import tiny_bert
from tests.tolerances import FP32_LAYER_REL, assert_rel_close
from tpformer.data.steps import StepInput, StepLoader, prepare_step
from tpformer.data.synthetic import SyntheticPretraining
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.train.objectives import MaskedLMObjective


class Steps:
    """Synthetic BERT micro-batches of one DP rank (2 micro-batches of 3 samples per step)."""

    def __init__(self, fail_at: int = -1, exit_at: int = -1, width: int = 16) -> None:
        self.data = SyntheticPretraining(
            arch="bert", vocab_size=100, seq_length=16, mask_prob=0.15, seed=3
        )
        self.fail_at, self.exit_at, self.width = fail_at, exit_at, width

    def __call__(self, step: int) -> list:
        if step == self.fail_at:
            raise ValueError(f"sample file unreadable at step {step}")
        if step == self.exit_at:
            os._exit(3)  # a worker killed (out of memory, a segfault in a tokenizer)
        return [
            (step * 6 + m * 3, self.data.batch(range(step * 6 + m * 3, step * 6 + m * 3 + 3)))
            for m in range(2)
        ]

    def mask_width(self, step: int) -> int:
        return self.width


def _steps(workers: int, first: int = 0, stop: int = 7, **kwargs: int) -> list[StepInput]:
    loader = StepLoader(
        Steps(**kwargs),
        MaskedLMObjective(0.15),
        first=first,
        stop=stop,
        num_workers=workers,
        prefetch_steps=3,
        pin_memory=False,
    )
    return list(loader)


def _same(a: StepInput, b: StepInput) -> bool:
    return (
        a.step == b.step
        and a.mask_width == b.mask_width
        and torch.equal(a.counts, b.counts)
        and [k for k, _ in a.parts] == [k for k, _ in b.parts]
        and all(
            x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)
            for (_, x), (_, y) in zip(a.parts, b.parts)
        )
    )


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_give_the_steps_built_in_line_in_order(workers: int) -> None:
    inline = _steps(0)
    assert [s.step for s in inline] == list(range(7))
    background = _steps(workers)
    assert len(background) == 7 and all(_same(a, b) for a, b in zip(inline, background))
    resumed = _steps(workers, first=4)  # a resumed run starts at its step
    assert all(_same(a, b) for a, b in zip(inline[4:], resumed)) and len(resumed) == 3


def test_counts_are_this_ranks_objective_counts_tokens_and_real_tokens() -> None:
    source, objective = Steps(), MaskedLMObjective(0.15)
    prepared = prepare_step(source, objective, 2)
    parts = source(2)
    masked = sum(int((b["mlm_labels"] != -100).sum()) for _, b in parts)
    tokens = sum(b["input_ids"].numel() for _, b in parts)
    assert "attention_mask" not in parts[0][1]  # fixed-width samples: every token is real
    assert prepared.counts.tolist() == [masked, 6, tokens, tokens]
    assert prepared.counts.dtype == torch.float64


def test_a_source_narrower_than_its_batches_is_refused() -> None:
    with pytest.raises(RuntimeError, match=r"16 tokens wide but the source says .* widest is 8"):
        prepare_step(Steps(width=8), MaskedLMObjective(0.15), 0)


@pytest.mark.parametrize("workers", [0, 2])
def test_an_error_in_a_worker_ends_the_run_with_that_error(workers: int) -> None:
    with pytest.raises(ValueError, match="sample file unreadable at step 3"):
        _steps(workers, fail_at=3)
    assert not multiprocessing.active_children()  # the workers were stopped with the error


def test_a_loader_left_open_does_not_hold_the_process_at_exit() -> None:
    """Workers ignore SIGTERM (preemption is the training process's to handle); one left
    running would make multiprocessing's exit handler (terminate, then join) wait forever."""
    script = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, {root!r})
        from tests.data.test_steps import Steps
        from tpformer.data.steps import StepLoader
        from tpformer.train.objectives import MaskedLMObjective
        loader = StepLoader(Steps(), MaskedLMObjective(0.15), first=0, stop=100, num_workers=2,
                            prefetch_steps=4, pin_memory=False)
        next(iter(loader))
        print("left open")
        """
    ).format(root=str(Path(__file__).resolve().parents[2]))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0 and "left open" in result.stdout, result.stderr[-2000:]


def test_a_dead_worker_ends_the_run_instead_of_hanging(tmp_path: Path) -> None:
    """A worker that exits without a word: the loader raises (DataLoader's watchdog). Run in a
    subprocess with a timeout, so a hang fails the test instead of the suite."""
    script = textwrap.dedent(
        """
        import sys
        sys.path.insert(0, {root!r})
        from tests.data.test_steps import _steps
        try:
            _steps(2, exit_at=2)
        except RuntimeError as err:
            print("raised:", err)
            sys.exit(0)
        sys.exit("the loader finished although a worker died")
        """
    ).format(root=str(Path(__file__).resolve().parents[2]))
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "exited unexpectedly" in result.stdout


class PaddedSteps(Steps):
    """Steps whose first micro-batch has padding (its last sample two tokens short) and whose
    second has none: both carry a padding mask, as a real corpus's batches do."""

    def __call__(self, step: int) -> list:
        parts = super().__call__(step)
        for _, batch in parts:
            batch["attention_mask"] = torch.ones_like(batch["input_ids"])
        parts[0][1]["attention_mask"][-1, -2:] = 0
        return parts


def test_a_micro_batch_without_padding_runs_without_a_mask_and_computes_the_same() -> None:
    """Decided on the host: the unpadded micro-batch loses its all-ones mask (its attention
    then takes none: flash on CUDA), the padded one keeps it, the step still reports its pad
    fraction, and BERT's loss on the unpadded batch is the same with the mask and without."""
    prepared = prepare_step(PaddedSteps(), MaskedLMObjective(0.15), 0)
    (_, padded), (_, full) = prepared.parts
    assert "attention_mask" in padded and "attention_mask" not in full
    assert prepared.padded
    tokens, real = prepared.counts[-2:].tolist()
    assert (tokens, real) == (96, 94)
    ctx = ParallelContext.single(device="cpu")
    model = build_model(tiny_bert(vocab_size=100), ctx, task="pretraining")
    inputs = {k: full[k] for k in ("input_ids", "token_type_ids", "mlm_labels", "nsp_labels")}
    without = model(**inputs).loss
    with_mask = model(**inputs, attention_mask=torch.ones_like(full["input_ids"])).loss
    assert_rel_close(without, with_mask, FP32_LAYER_REL, "loss without the all-ones mask")
