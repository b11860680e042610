"""Architectures assembled from tpformer.layers, and the factory that initializes them."""

from __future__ import annotations

from typing import Any

import torch

from tpformer.config.schema import ModelConfig
from tpformer.layers.dropout import assign_dropout_sites
from tpformer.models.base import TPModel
from tpformer.models.bert import BertForPreTraining, BertForSequenceClassification, BertModel
from tpformer.models.gpt import GPTForCausalLM, GPTModel
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import initialize_parameters
from tpformer.parallel.param_info import copy_param_info

TASKS = {
    ("bert", "base"): BertModel,
    ("bert", "pretraining"): BertForPreTraining,
    ("bert", "classification"): BertForSequenceClassification,
    ("gpt", "base"): GPTModel,
    ("gpt", "causal_lm"): GPTForCausalLM,
}


def build_model(
    config: ModelConfig,
    ctx: ParallelContext,
    *,
    task: str,
    initialize: bool = True,
    **kwargs: Any,
) -> TPModel:
    """Construct, key the dropout sites by module name and (optionally) initialize.

    The initialization is layout independent: the same seed gives the TP=1 weights' slices.
    Pass initialize=False when a checkpoint will be loaded next.
    """
    cls = TASKS.get((config.arch, task))
    if cls is None:
        valid = [t for a, t in TASKS if a == config.arch]
        raise ValueError(f"a {config.arch} model has no {task} task; its tasks: {', '.join(valid)}")
    with torch.device(ctx.device):  # made where they run: on meta (a dry run), no host copy
        model = cls(config, ctx, **kwargs)
    built = dict(model.named_parameters())
    model.to(ctx.device)
    for name, param in model.named_parameters():  # a move to another kind of device (meta)
        copy_param_info(built[name], param)  # makes new Parameters: keep their records
    assign_dropout_sites(model)
    if initialize:
        initialize_parameters(model, ctx.rng, ctx.tp, std=config.init_std)
    return model


__all__ = [
    "BertForPreTraining",
    "BertForSequenceClassification",
    "BertModel",
    "GPTForCausalLM",
    "GPTModel",
    "TPModel",
    "build_model",
]
