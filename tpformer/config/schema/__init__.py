"""Typed schema of the Hydra groups, one module per group: types, defaults and a docstring per
key (the docs' configuration reference is generated from them). YAML only composes: presets
set what differs."""

from __future__ import annotations

from tpformer.config.schema.choices import (
    MISSING,
    Activation,
    Arch,
    Choice,
    CpuOffload,
    DataSource,
    Decay,
    GlueTaskName,
    GradCompression,
    Logger,
    LrScaling,
    OptimizerName,
    PipeDreamUpdate,
    PipelineSchedule,
    PipelineSplit,
    Precision,
    Range,
    Recompute,
    RngMode,
    SamplingMode,
    SentencePairs,
    TokenizerType,
    WarmupStyle,
    ZeroStage,
    ranged,
)
from tpformer.config.schema.cluster import ClusterConfig
from tpformer.config.schema.data import DataConfig, GlueDataConfig, LoaderConfig
from tpformer.config.schema.jobs import (
    Config,
    DryRunConfig,
    EvalLMConfig,
    FinetuneConfig,
    FinetuneModelConfig,
    GenerateConfig,
    PlanConfig,
    PlanOptions,
)
from tpformer.config.schema.model import ModelConfig
from tpformer.config.schema.optim import OptimConfig
from tpformer.config.schema.parallel import ParallelConfig
from tpformer.config.schema.trainer import (
    FinetuneTrainerConfig,
    LauncherConfig,
    LoopConfig,
    ProfileConfig,
    TrainerConfig,
)

__all__ = [
    "MISSING",
    "Activation",
    "Arch",
    "Choice",
    "ClusterConfig",
    "Config",
    "CpuOffload",
    "DataConfig",
    "DataSource",
    "Decay",
    "DryRunConfig",
    "EvalLMConfig",
    "FinetuneConfig",
    "FinetuneModelConfig",
    "FinetuneTrainerConfig",
    "GenerateConfig",
    "GlueDataConfig",
    "GlueTaskName",
    "GradCompression",
    "LauncherConfig",
    "LoaderConfig",
    "Logger",
    "LoopConfig",
    "LrScaling",
    "ModelConfig",
    "OptimConfig",
    "OptimizerName",
    "ParallelConfig",
    "PipeDreamUpdate",
    "PipelineSchedule",
    "PipelineSplit",
    "PlanConfig",
    "PlanOptions",
    "Precision",
    "ProfileConfig",
    "Range",
    "Recompute",
    "RngMode",
    "SamplingMode",
    "SentencePairs",
    "TokenizerType",
    "TrainerConfig",
    "WarmupStyle",
    "ZeroStage",
    "ranged",
]
