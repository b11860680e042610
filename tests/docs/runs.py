"""How a test runs documented commands (tests/docs/test_documented_*.py): the command read from
its page, what the test replaces in it (sizes, its own files' names), the sizes it appends for
what the command leaves to its defaults, and what must be true after it ran; a table of them in
one process (tests/cli/bad_input_cases.py's runner)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path

from tests.cli.bad_input_cases import run_cases_with_children
from tests.docs.commands import arguments, documented, with_sizes
from tests.train.test_trainer import QUIET

SCRIPTS = {  # console script -> its entry point, as the installed package declares them
    entry.name: entry.value
    for entry in entry_points(group="console_scripts")
    if entry.name.startswith("tpformer-")
}
MODEL_SIZES = [
    "model.num_layers=2",
    "model.hidden_size=32",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "model.vocab_size=200",
]
SIZES = [  # what every case shrinks that its command leaves to the defaults
    *MODEL_SIZES,
    "data.seq_length=32",
    "trainer.micro_batch_size=4",
    "trainer.max_steps=2",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "trainer.progress=false",
    "data.cache_dir=cache",
    *QUIET,
]

FINETUNE_SIZES = ("data.cache_dir=cache",)  # its model comes from init=: no model.* sizes


@dataclass(frozen=True)
class DocumentedRun:
    """A documented command (the start of its text), what the test changes of it, what it adds
    (beyond SIZES), and what must be true after it ran (besides exit code 0)."""

    start: str
    check: Callable[[Path, str, str], object]
    replace: dict[str, str] = field(default_factory=dict)
    extra: tuple[str, ...] = ()
    sizes: tuple[str, ...] = tuple(SIZES)
    hydra: bool = True  # a Hydra entry point: a run directory of its own unless it names one

    def runnable(self, cwd: Path, number: int) -> list:
        """[script, argv, cwd, env] for the runner; a run directory of its own (outputs/N)
        where the command names none."""
        env, argv = arguments(documented(self.start), self.replace)
        script = SCRIPTS[documented(self.start).split()[len(env)]]
        sizes = [*self.sizes, *([f"hydra.run.dir=outputs/{number}"] if self.hydra else [])]
        return [script, with_sizes([*argv, *self.extra], sizes), str(cwd), env]


def trained(steps: int) -> Callable[[Path, str, str], None]:
    def check(cwd: Path, output: str, run: str) -> None:
        assert f"done: step {steps}" in output, output[-2000:]

    return check


def has(*texts: str) -> Callable[[Path, str, str], None]:
    def check(cwd: Path, output: str, run: str) -> None:
        for text in texts:
            assert text in output, (text, output[-2000:])

    return check


def exists(*patterns: str) -> Callable[[Path, str, str], None]:
    """Files the run wrote; "{run}" is the case's own run directory (outputs/N)."""

    def check(cwd: Path, output: str, run: str) -> None:
        for pattern in patterns:
            assert list(cwd.glob(pattern.format(run=run))), (pattern, output[-2000:])

    return check


def run_table(
    tmp_path: Path, cases: list[DocumentedRun], env: dict[str, str] | None = None
) -> None:
    """Every case in one process (with `env`: what libraries read once, at import), in order;
    each failure named with its output's end and its ranks' (a launcher's children)."""
    runnables = [case.runnable(tmp_path, i) for i, case in enumerate(cases)]
    outcomes, children = run_cases_with_children(runnables, env, timeout=900)
    failed = []
    for i, (case, (code, stdout, stderr, _)) in enumerate(zip(cases, outcomes, strict=True)):
        try:
            assert code in (0, None), (
                f"exit {code}: {(stdout + stderr)[-1500:]}\nits ranks: {children[i][-3000:]}"
            )
            case.check(tmp_path, stdout + stderr, f"outputs/{i}")
        except AssertionError as err:
            failed.append(f"{case.start}: {err}")
    assert not failed, "\n\n".join(failed)
