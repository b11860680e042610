"""The profiled pipeline split times work, not kernel launches: every timed call of
median_seconds (the layer timer of parallel.pipeline_split=profile and the all-reduce bandwidth
of PipeDream's partitioner) sits between two device synchronizations, after one untimed call."""

from __future__ import annotations

import pytest
import torch

import tpformer.parallel.link_timing as link_timing
from tests.models.common import tiny_gpt
from tpformer.parallel.context import ParallelContext
from tpformer.planner.split import profile_costs


def test_each_timed_call_is_between_two_synchronizations(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    monkeypatch.setattr(link_timing, "synchronize", lambda device: events.append("sync"))
    link_timing.median_seconds(lambda: events.append("call"), torch.device("cpu"), repeats=3)
    assert events == ["call"] + ["sync", "call", "sync"] * 3


def test_the_layer_profile_synchronizes_around_every_part(monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[torch.device] = []
    monkeypatch.setattr(link_timing, "synchronize", synced.append)
    from tpformer.models import build_model

    config = tiny_gpt()
    model = build_model(config, ParallelContext.single(device="cpu"), task="causal_lm")
    ids = torch.randint(0, config.vocab_size, (2, 16))
    costs = profile_costs(model, {"input_ids": ids, "labels": ids})
    assert len(costs.layers) == config.num_layers and min(costs.layers) > 0
    assert len(synced) == 2 * 3 * (config.num_layers + 2)  # embedding, each layer, the head
