"""The planner and context parallelism: CP layouts are enumerated for long sequences, priced
with 1/cp of the activations and the ring's traffic, and run as the overrides they print."""

from __future__ import annotations

from dataclasses import replace

from tests.train.test_trainer import tiny_config
from tpformer.config.presets import preset
from tpformer.planner.candidate import (
    CONTEXT_MIN_SEQ,
    Candidate,
    Workload,
    candidate_of,
    enumerate_candidates,
)
from tpformer.planner.cluster import load_preset, resolve_cluster
from tpformer.planner.memory import predict_memory
from tpformer.planner.step_time import context_comm_time, local_core_share, predict_time


def _h100():
    return resolve_cluster(
        replace(load_preset("h100_node"), calibration="none"), "bf16", cache_dir=""
    )


def test_long_sequences_enumerate_context_parallel_layouts() -> None:
    cluster = _h100()
    long = Workload(preset("gpt2_xl", max_position_embeddings=32768), 32768, 8, "bf16", 1.0)
    short = replace(long, seq=CONTEXT_MIN_SEQ // 2)
    cps = {c.cp for c in enumerate_candidates(long, 8, cluster.gpus_per_node)}
    assert cps == {1, 2, 4, 8}
    assert {c.cp for c in enumerate_candidates(short, 8, cluster.gpus_per_node)} == {1}
    for c in enumerate_candidates(long, 8, cluster.gpus_per_node):
        assert c.tp * c.pp * c.dp * c.cp == 8


def test_context_parallelism_divides_activations_and_prices_the_ring() -> None:
    cluster = _h100()
    work = Workload(
        preset("gpt2_xl", max_position_embeddings=32768), 32768, 8, "bf16", 1.0, rng="fast"
    )
    two, four = (Candidate(1, 1, 8 // cp, 1, 1, 1, cp=cp) for cp in (2, 4))
    acts = [predict_memory(work, c, cluster).activations for c in (two, four)]
    assert 0.45 < acts[1] / acts[0] < 0.55  # 1/cp (the embedding and head shares too)
    assert context_comm_time(work, two, cluster) > 0
    assert predict_time(work, Candidate(1, 1, 8, 1, 1, 1), cluster).tensor_comm == 0
    assert "parallel.context=2" in two.overrides()
    assert "cp2" in two.label()


def test_a_config_with_context_is_its_candidate() -> None:
    config = tiny_config(context=2)
    assert candidate_of(config, 1).cp == 2
    assert Candidate(1, 1, 1, 4, 1, cp=2).apply(config).parallel.context == 2


def test_local_layers_are_priced_by_the_attention_they_run() -> None:
    """ModernBERT-base at 8k tokens, window 128: where flash runs the window (bf16, unpadded,
    no attention dropout) a local layer's attention GEMMs are its band's share of a global
    one's; under CP=4 the ring's blocks out of reach are skipped (each rank computes its own
    block and its neighbours' of 8 chunks of 1,024 positions: 2 or 3 of 4); with a band mask
    (padded batches) every score is computed, so the local layer costs a global one's time."""
    cluster = _h100()
    model = preset("modernbert_base", max_position_embeddings=8192)
    work = Workload(model, 8192, 8, "bf16", 0.3, rng="fast", padded=False)
    one, four = Candidate(1, 1, 8, 1, 1, 1), Candidate(1, 1, 2, 1, 1, 1, cp=4)
    band = (8192 * 129 - 64 * 65) / 8192**2
    assert local_core_share(work, one, cluster) == band
    assert local_core_share(replace(work, padded=True), one, cluster) == 1.0
    assert local_core_share(work, four, cluster) == 3 / 4
    everywhere = replace(work, model=replace(model, local_attention=None))
    for c in (one, four):
        assert predict_time(work, c, cluster).compute < predict_time(everywhere, c, cluster).compute
    padded = replace(work, padded=True)
    padded_global = replace(everywhere, padded=True)
    assert (
        predict_time(padded, one, cluster).compute
        == predict_time(padded_global, one, cluster).compute
    )
