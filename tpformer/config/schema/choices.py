"""Allowed values of the schema's keys (an Enum per choice, names equal to values, as OmegaConf
looks a string up by member name) and numeric ranges the validator checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Any

MISSING: Any = "???"
"""OmegaConf's marker of a required value (omegaconf.MISSING), spelled here so the schema, and
everything that builds models from it, imports without Hydra (tools/gpu_check.py on a bare GPU
machine)."""


class Choice(str, Enum):
    """A string key with a closed set of values: Hydra rejects others, naming the valid ones.

    Members compare equal to their strings (`Precision.bf16 == "bf16"`) and print as them.
    """

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Arch(Choice):
    bert = "bert"
    gpt = "gpt"


class Activation(Choice):
    gelu = "gelu"
    gelu_tanh = "gelu_tanh"
    silu = "silu"


class Norm(Choice):
    layernorm = "layernorm"
    rmsnorm = "rmsnorm"


class NormPosition(Choice):
    post = "post"
    pre = "pre"


class RopeScaling(Choice):
    none = "none"
    linear = "linear"
    dynamic = "dynamic"
    llama3 = "llama3"


class Precision(Choice):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"


class Recompute(Choice):
    none = "none"
    selective = "selective"
    full = "full"


class RngMode(Choice):
    auto = "auto"
    exact = "exact"
    fast = "fast"


class GradCompression(Choice):
    none = "none"
    bf16 = "bf16"
    powersgd = "powersgd"


class OptimizerName(Choice):
    adamw = "adamw"
    lamb = "lamb"
    lars = "lars"
    novograd = "novograd"


class Decay(Choice):
    linear = "linear"
    cosine = "cosine"


class WarmupStyle(Choice):
    megatron = "megatron"
    transformers = "transformers"


class LrScaling(Choice):
    none = "none"
    linear = "linear"
    sqrt = "sqrt"


class SamplingMode(Choice):
    greedy = "greedy"
    sample = "sample"


class DataSource(Choice):
    shakespeare = "shakespeare"
    text = "text"
    jsonl = "jsonl"
    hf = "hf"
    megatron = "megatron"
    synthetic = "synthetic"


class DocumentBoundary(Choice):
    blank_line = "blank_line"
    file = "file"
    line = "line"


class TokenizerType(Choice):
    bpe = "bpe"
    unigram = "unigram"


class Logger(Choice):
    tensorboard = "tensorboard"
    wandb = "wandb"


class PipelineSplit(Choice):
    balanced = "balanced"
    profile = "profile"
    pipedream = "pipedream"


class PipeDreamUpdate(Choice):
    micro_batch = "micro_batch"
    step = "step"


class SentencePairs(Choice):
    auto = "auto"
    nsp = "nsp"
    sop = "sop"
    none = "none"


class Pooler(Choice):
    tanh = "tanh"
    head = "head"


class ClassifierPooling(Choice):
    cls = "cls"
    mean = "mean"


class FinetuneTaskName(Choice):
    """A GLUE task, or classification / regression / multilabel on the user's own files."""

    cola = "cola"
    sst2 = "sst2"
    mrpc = "mrpc"
    stsb = "stsb"
    qqp = "qqp"
    mnli = "mnli"
    qnli = "qnli"
    rte = "rte"
    wnli = "wnli"
    classification = "classification"
    regression = "regression"
    multilabel = "multilabel"


OWN_TASKS = ("classification", "regression", "multilabel")
"""The FinetuneTaskName values that read the user's own files (data.text_column, ...)."""


# OmegaConf looks a string value up by member name, so names must equal values; where a value
# is no identifier ("1f1b", "optimizer+params", 0) the functional API makes the Enum, and mypy,
# which cannot read those names, sees the base class.
if TYPE_CHECKING:
    CpuOffload = Choice
    PipelineSchedule = Choice
    ZeroStage = IntEnum
else:
    CpuOffload = Choice(
        "CpuOffload",
        {v: v for v in ("none", "optimizer", "optimizer+params")},
        module=__name__,
        qualname="CpuOffload",
    )
    PipelineSchedule = Choice(
        "PipelineSchedule",
        {v: v for v in ("gpipe", "1f1b", "interleaved_1f1b", "pipedream")},
        module=__name__,
        qualname="PipelineSchedule",
    )
    ZeroStage = IntEnum(
        "ZeroStage", {str(i): i for i in range(4)}, module=__name__, qualname="ZeroStage"
    )
    """0, 1, 2 or 3; compares and orders as the int."""


@dataclass(frozen=True)
class Range:
    """The valid values of a numeric key: lo <= x (or lo < x), x <= hi (or x < hi)."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def contains(self, x: float) -> bool:
        if self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo):
            return False
        return self.hi is None or (x < self.hi if self.hi_open else x <= self.hi)

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        return (
            f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}"
            f"{')' if self.hi_open else ']'}"
        )


def ranged(
    default: float | int | None,
    lo: float,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Any:
    """A numeric field whose valid range the validator checks (None always passes)."""
    return field(default=default, metadata={"range": Range(lo, hi, lo_open, hi_open)})
