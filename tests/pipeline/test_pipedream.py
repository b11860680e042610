"""PipeDream (parallel.pipeline_schedule=pipedream) against its own definition.

The schedule as data: deadlock-free, zero idle time in the steady state, each forward's weight
version as `pipedream_version` states it. The pipeline at p=2 and p=4 (and TP=2 x PP=2), with and
without vertical sync, updating per micro-batch or per step: its losses and final weights equal,
within 1e-5, a one-process reference that keeps every stage's weight history and runs each
micro-batch's forward and backward with the versions the definition names, then applies each
stage's updates (AdamW, weight decay on matrices, clipping by the stage's own norm) with the
learning rate of the step in which that stage makes the update.
"""

import itertools
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.dist import run_distributed
from tests.pipeline.test_pipeline_training import pipeline_config
from tests.tolerances import FP32_MODEL_REL
from tpformer.checkpoint import store
from tpformer.config.rules.parallel import validate_pipedream, validate_replication
from tpformer.config.schema import Config
from tpformer.engine.parallelize import parallelize
from tpformer.models import build_model
from tpformer.parallel.comm import all_reduce
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import gather_full
from tpformer.parallel.pipeline.schedule import (
    Action,
    pipedream_drain,
    pipedream_step,
    pipedream_version,
    pipedream_warmup,
    replica_backwards_per_update,
)
from tpformer.parallel.pipeline.simulate import simulate
from tpformer.parallel.pipeline.stage import build_stage
from tpformer.planner.split import choose_split
from tpformer.train.objectives import CausalLMObjective
from tpformer.train.pretraining import pretraining_trainer

TOLERANCE = FP32_MODEL_REL
"""1e-5: relative on each step's loss; on the weights, of the stage's largest weight."""
MICRO, BATCH, SEQ, STEPS = 4, 2, 16, 3
LRS = [1e-3, 2e-3, 5e-4]
"""A different learning rate each step: an update made in the wrong step shows."""


# ----------------------------------------------------------------------------- schedule


@pytest.mark.parametrize(("stages", "micro"), itertools.product([2, 3, 4], [1, 2, 3, 4]))
def test_schedule_runs_every_micro_batch_once_and_never_deadlocks(stages: int, micro: int) -> None:
    steps = 3
    for r in range(stages):
        actions = [a for t in range(steps) for a in pipedream_step(stages, micro, r, t)]
        actions += pipedream_drain(stages, micro, r, steps)
        for kind in "FB":
            assert [a.micro for a in actions if a.kind == kind] == list(range(steps * micro))
        forwards = [a for a in pipedream_step(stages, micro, r, 1) if a.kind == "F"]
        assert [a.micro for a in forwards] == list(range(micro, 2 * micro))  # a step's own
    sim = simulate("pipedream", stages, micro, steps=steps)  # raises on a deadlock
    assert sim.peak_in_flight == [min(stages - r, steps * micro) for r in range(stages)]


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_steady_state_has_no_bubble(stages: int) -> None:
    """Equal stages (backward = 2 x forward): between the forward of micro-batch 2m and that of
    4m no stage ever waits, while 1F1B-flush idles (p - 1) / (m + p - 1) of every step."""
    micro = 4
    sim = simulate("pipedream", stages, micro, steps=6)
    for r in range(stages):
        assert sim.idle_between(r, Action("F", 2 * micro), Action("F", 4 * micro)) == 0.0
    flush = simulate("1f1b", stages, micro)
    assert flush.bubble == pytest.approx((stages - 1) / (micro + stages - 1))


@pytest.mark.parametrize("every", [1, 4])
@pytest.mark.parametrize("stages", [2, 4])
def test_versions_are_the_updates_before_each_forward(stages: int, every: int) -> None:
    """Counted off the lists: the stage's updates (one per `every` backwards) before each
    forward; vertical sync: the first stage's count for that micro-batch."""
    micro, steps = 4, 4
    for r in range(stages):
        backwards, seen = 0, {}
        for action in [a for t in range(steps) for a in pipedream_step(stages, micro, r, t)]:
            if action.kind == "B":
                backwards += 1
            else:
                seen[action.micro] = backwards // every
        for i, version in seen.items():
            assert pipedream_version(stages, r, i, every=every, vertical_sync=False) == version
            first = max(0, i - pipedream_warmup(stages, 0)) // every
            assert pipedream_version(stages, r, i, every=every, vertical_sync=True) == first


REPLICATED = [(2, 1), (1, 2), (2, 1, 1), (1, 1, 2), (3, 1), (2, 2), (1, 3, 2), (4, 1)]


@pytest.mark.parametrize("replicas", REPLICATED)
@pytest.mark.parametrize("every_step", [False, True])
def test_replicated_schedule_runs_round_robin_and_never_deadlocks(
    replicas: tuple[int, ...], every_step: bool
) -> None:
    """Replica j of a stage of n runs micro-batches j, j + n, ... forward and backward once;
    with the replicas' joint updates as barriers, no configuration deadlocks; the versions
    counted off each replica's list (its own backwards before each forward, per update) equal
    pipedream_version."""
    stages, micro, steps = len(replicas), 2 * math.lcm(*replicas), 3
    for r, n in enumerate(replicas):
        every = replica_backwards_per_update(micro, n, every_step=every_step)
        for j in range(n):
            actions = [
                a for t in range(steps) for a in pipedream_step(stages, micro, r, t, replicas, j)
            ]
            actions += pipedream_drain(stages, micro, r, steps, replicas, j)
            mine = list(range(j, steps * micro, n))
            for kind in "FB":
                assert [a.micro for a in actions if a.kind == kind] == mine
            backwards, seen = 0, {}
            for action in actions:
                if action.kind == "B":
                    backwards += 1
                else:
                    seen[action.micro] = backwards // every
            for i, version in seen.items():
                assert version == pipedream_version(
                    stages, r, i, every=every, vertical_sync=False, replicas=replicas
                )
    simulate(  # raises on a deadlock
        "pipedream", stages, micro, steps=steps, replicas=replicas, every_step=every_step
    )


def test_replicated_input_stage_fills_the_bottleneck() -> None:
    """PipeDream's case for replication: stage 0 twice as slow as stage 1. On one worker each
    the fast stage idles half the time; "2-1" (stage 0 on two workers taking alternate
    micro-batches) leaves no worker idle in the steady state and runs twice the micro-batches
    per unit of time."""
    micro, steps = 4, 8
    plain = simulate("pipedream", 2, micro, steps=steps, forward_time=[2.0, 1.0])
    replicated = simulate(
        "pipedream", 2, micro, steps=steps, forward_time=[2.0, 1.0], replicas=(2, 1)
    )
    assert plain.makespan / replicated.makespan == pytest.approx(2.0, rel=0.1)
    assert replicated.bubble < 0.1 < 0.25 < plain.bubble


# ----------------------------------------------------------------------------- the runs


def _config(stages: int, tp: int = 1, **parallel: object) -> Config:
    config = pipeline_config(
        "gpt", pipeline=stages, tensor=tp, pipeline_schedule="pipedream", **parallel
    )
    config = replace(config, optim=replace(config.optim, clip_grad=0.05, weight_decay=0.1))
    assert config.model.num_layers == 4
    return config


def _batches(steps: int = STEPS) -> list[list[tuple[int, dict[str, torch.Tensor]]]]:
    """STEPS steps of MICRO micro-batches of BATCH random sequences; key = first sample."""
    gen = torch.Generator().manual_seed(7)
    return [
        [
            (
                (t * MICRO + j) * BATCH,
                {"input_ids": torch.randint(5, 128, (BATCH, SEQ), generator=gen)},
            )
            for j in range(MICRO)
        ]
        for t in range(steps)
    ]


def _counts() -> torch.Tensor:
    return torch.tensor([MICRO * BATCH * (SEQ - 1)], dtype=torch.float64)


def _pipeline(
    ctx: ParallelContext, config: Config, steps: int = STEPS
) -> tuple[list[float], dict, int]:
    """Losses per step (last stage), this stage's full weights after the drain, peak stash,
    the gradient norm of the stage's last update in each step."""
    model = build_model(config.model, ctx, task="causal_lm")
    split = choose_split(
        config.model,
        config.parallel.pipeline_split,
        list(config.parallel.pipeline_layers),
        ctx.layout.pp,
        1,
        head_fraction=0.0,
        seq=SEQ,
    )
    par = parallelize(model, config.parallel, config.optim, ctx, split=split.split)
    objective, losses, norms = CausalLMObjective(), [], []
    half, d = BATCH // ctx.dp.size, ctx.dp.rank  # this DP rank's samples of each micro-batch
    for step, parts in enumerate(_batches(steps)):
        mine = [
            (key + d * half, {k: v[d * half : (d + 1) * half] for k, v in b.items()})
            for key, b in parts
        ]
        par.engine.set_lr(LRS[step])
        totals = par.runner.run(step, mine, objective, _counts(), mask_width=SEQ, train=True)
        norms.append(float(par.runner.update()["grad_norm"]))
        losses.append(float(all_reduce(totals, ctx.replicas)[0]))  # as the loop sums them
    par.runner.drain()
    weights = {n: gather_full(p, ctx.tp).clone() for n, p in model.named_parameters()}
    stash = getattr(par.pipeline, "stash", None)  # pipedream's (the flushed schedules have none)
    if stash is None:
        return losses, weights, 0, norms
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert stash.peak_bytes == stash.peak * weight_bytes  # each version: a copy of the stage
    return losses, weights, stash.peak, norms


def _update_step(
    stage: int, stages: int, index: int, steps: int, replicas: tuple[int, ...] = ()
) -> int:
    """The step in which `stage` makes the update after micro-batch `index`'s backward: the step
    of the forward that backward follows in its replica's 1F1B order (the drain: the last
    step); a replica of n runs micro-batches index // n of its own, MICRO / n per step."""
    n = replicas[stage] if replicas else 1
    return min((index // n + pipedream_warmup(stages, stage, replicas)) // (MICRO // n), steps - 1)


def _clip(params: list[torch.Tensor], clip: float) -> float:
    """Clip to `clip` by the stage's own norm, the norms summed in float64 (as the engine);
    returns the norm before clipping."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.stack(torch._foreach_norm(grads)).double().square().sum().sqrt()
    if clip > 0 and norm > clip:
        torch._foreach_mul_(grads, clip / (norm + 1e-6))
    return float(norm)


def _reference(
    config: Config,
    stages: int,
    *,
    vertical_sync: bool,
    every: int,
    steps: int = STEPS,
    replicas: tuple[int, ...] = (),
    rng: str = "exact",
) -> tuple:
    """One process: stage r's weights are a history of versions; micro-batch i runs forward and
    backward with version pipedream_version(r, i) of every stage, then each stage whose update
    is due applies the mean of its micro-batches' gradients (each micro-batch's loss scaled by
    MICRO, as the pipeline scales it to a whole step's). `every`: micro-batches per update (1
    or MICRO); with `replicas`, a stage of n replicas updates once per n micro-batches (the
    replicas' joint update) or per MICRO, its versions counted in its replicas' numbering."""
    sizes = [replicas[r] if replicas else 1 for r in range(stages)]
    local_every = [every // n if every == MICRO else every for n in sizes]
    per_update = [e * n for e, n in zip(local_every, sizes)]
    ctx = ParallelContext.single(seed=config.parallel.seed, device="cpu", rng=rng)
    split = [1] * stages if stages == 4 else [2, 2]
    stage_models = []
    for r in range(stages):
        model = build_model(config.model, ctx, task="causal_lm")
        stage_models.append((model, build_stage(model, split, r, stages, tie_ends=False)))
    params = [list(m.parameters()) for m, _ in stage_models]
    optimizers = []
    for ps in params:
        decayed = [p for p in ps if p.dim() >= 2]
        rest = [p for p in ps if p.dim() < 2]
        groups = [{"params": decayed, "weight_decay": config.optim.weight_decay}]
        optimizers.append(
            torch.optim.AdamW(
                [*groups, {"params": rest, "weight_decay": 0.0}],
                lr=1.0,
                betas=(config.optim.beta1, config.optim.beta2),
                eps=config.optim.eps,
                fused=True,
            )
        )
    history = [[[p.detach().clone() for p in ps]] for ps in params]
    sums = [[torch.zeros_like(p) for p in ps] for ps in params]
    objective, losses = CausalLMObjective(), []
    norms: list[dict[int, float]] = [{} for _ in range(stages)]  # stage -> step -> last update's
    for step, parts in enumerate(_batches(steps)):
        ctx.rng.mask_width = SEQ
        losses.append(0.0)
        for j, (key, batch) in enumerate(parts):
            index = step * MICRO + j
            live = [[p.detach().clone() for p in ps] for ps in params]
            for r in range(stages):
                version = pipedream_version(
                    stages,
                    r,
                    index,
                    every=local_every[r],
                    vertical_sync=vertical_sync,
                    replicas=replicas,
                )
                with torch.no_grad():
                    for p, v in zip(params[r], history[r][version]):
                        p.copy_(v)
            ctx.rng.set_position(step, key)
            inputs = objective.model_inputs(batch)
            x = None
            for _, stage in stage_models:
                x = stage.forward(0, x, inputs)
            values = objective.values(stage_models[-1][1].head(x, inputs), inputs, _counts())
            losses[-1] += float(values[0].detach())
            (values[0] * MICRO).backward()
            with torch.no_grad():
                for r in range(stages):
                    for total, p, v in zip(sums[r], params[r], live[r]):
                        if p.grad is not None:
                            total += p.grad
                        p.copy_(v)  # back to the live weights
                        p.grad = None
            for r in range(stages):
                if (index + 1) % per_update[r]:
                    continue
                for p, total in zip(params[r], sums[r]):
                    p.grad = total / per_update[r]
                    total.zero_()
                norm = _clip(params[r], config.optim.clip_grad)
                in_step = _update_step(r, stages, index, steps, replicas)
                norms[r][in_step] = norm
                for group in optimizers[r].param_groups:
                    group["lr"] = LRS[in_step]
                optimizers[r].step()
                optimizers[r].zero_grad(set_to_none=True)
                history[r].append([p.detach().clone() for p in params[r]])
    weights = [
        {n: gather_full(p, ctx.tp).clone() for n, p in m.named_parameters()}
        for m, _ in stage_models
    ]
    return losses, weights, norms


def _assert_weights_close(got: dict, want: dict, stage: int) -> None:
    """Every tensor within TOLERANCE of the stage's largest weight: the key biases' gradients
    are rounding noise (softmax ignores a constant added to keys), which Adam normalizes, so
    those tiny tensors differ in relative terms by more than the weights that learn."""
    assert got.keys() == want.keys()
    scale = max(float(w.abs().max()) for w in want.values())
    for name, value in got.items():
        error = float((value - want[name]).abs().max()) / scale
        assert error <= TOLERANCE, f"stage {stage} {name}: error {error:.2e} of the largest weight"


CASES = [  # (stages, vertical_sync, update, other layout degrees)
    (2, False, "micro_batch", {}),
    (2, True, "micro_batch", {}),
    (4, False, "micro_batch", {}),
    (4, True, "micro_batch", {}),
    (4, False, "step", {}),
    (2, False, "micro_batch", {"tensor": 2}),
    (2, False, "micro_batch", {"data": 2, "zero_stage": 1}),
    (2, False, "micro_batch", {"context": 2}),
]


@pytest.mark.sweep
@pytest.mark.parametrize(("stages", "vertical_sync", "update", "layout"), CASES)
def test_pipeline_equals_the_staleness_reference(
    stages: int, vertical_sync: bool, update: str, layout: dict
) -> None:
    """Also inside a stage: TP=2, DP=2 with ZeRO-1 (each DP rank half of every micro-batch,
    gradients summed over DP before each stage's update) and CP=2 (ring attention)."""
    split = [1] * stages if stages == 4 else [2, 2]
    tp, dp, cp = (layout.get(k, 1) for k in ("tensor", "data", "context"))
    config = _config(
        stages,
        tp,
        pipeline_layers=split,
        pipedream_vertical_sync=vertical_sync,
        pipedream_update=update,
        context=cp,
        zero_stage=layout.get("zero_stage", 0),
    )
    every = MICRO if update == "step" else 1
    want_losses, want_weights, _ = _reference(
        config, stages, vertical_sync=vertical_sync, every=every
    )
    ranks = run_distributed(
        _pipeline, stages * tp * dp * cp, config, tensor=tp, pipeline=stages, context=cp
    )
    for rank, (losses, weights, peak, _) in enumerate(ranks):
        stage = rank // (tp * dp * cp)
        if stage == stages - 1:
            for step, (got, want) in enumerate(zip(losses, want_losses)):
                assert abs(got - want) <= TOLERANCE * abs(want), (step, losses, want_losses)
        _assert_weights_close(weights, want_weights[stage], stage)
        if every == 1:  # stage r stashes p - r versions; p with vertical sync (measured)
            assert peak == (stages if vertical_sync else stages - stage), (stage, peak)
    if stages == 2 and tp == 1 and not vertical_sync:  # the two copies of wte trained apart
        first, last = ranks[0][1]["transformer.wte.weight"], ranks[-1][1]["transformer.wte.weight"]
        assert not torch.equal(first, last)


@pytest.mark.parametrize("stages", [2, 4])
def test_pipedream_under_fast_equals_its_staleness_reference(stages: int) -> None:
    """parallel.rng=fast, the accelerators' default: the stages draw the masks the one-process
    staleness reference draws (fast masks are keyed by step, sample, site and TP/CP rank, not
    by where or when a stage runs), so the asynchronous pipeline equals it as under exact."""
    split = [1] * stages if stages == 4 else [2, 2]
    config = _config(stages, pipeline_layers=split, rng="fast")
    want_losses, want_weights, _ = _reference(
        config, stages, vertical_sync=False, every=1, rng="fast"
    )
    ranks = run_distributed(_pipeline, stages, config, pipeline=stages, rng="fast")
    for stage, (losses, weights, _, _) in enumerate(ranks):
        if stage == stages - 1:
            for step, (got, want) in enumerate(zip(losses, want_losses, strict=True)):
                assert abs(got - want) <= TOLERANCE * abs(want), (step, losses, want_losses)
        _assert_weights_close(weights, want_weights[stage], stage)


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("replicas", "update", "zero_stage"),
    [
        ((2, 1), "micro_batch", 0),
        ((2, 1), "step", 0),
        ((1, 2), "micro_batch", 0),
        ((2, 1), "micro_batch", 1),
    ],
)
def test_replicated_stages_equal_the_staleness_reference(
    replicas: tuple[int, ...], update: str, zero_stage: int
) -> None:
    """PipeDream's "2-1" (and "1-2", and 2-1 with ZeRO-1 sharding the replicated stage's optimizer
    state over its two workers) on 3 ranks: a replicated stage's workers take alternate
    micro-batches and update together (gradients summed over them); losses and every replica's
    weights equal the one-process reference with the replicated versions within 1e-5, and so
    does the gradient norm of each stage's last update in a step (which the losses and the
    clipped AdamW weights would not show: the update's gradient is each stage's own mean)."""
    config = _config(2, pipeline_layers=[2, 2], pipedream_update=update, zero_stage=zero_stage)
    every = MICRO if update == "step" else 1
    want_losses, want_weights, want_norms = _reference(
        config, 2, vertical_sync=False, every=every, replicas=replicas
    )
    ranks = run_distributed(_pipeline, sum(replicas), config, pipeline=2, replicas=list(replicas))
    stage_of = [r for r, n in enumerate(replicas) for _ in range(n)]
    for rank, (losses, weights, peak, norms) in enumerate(ranks):
        stage = stage_of[rank]
        if update == "micro_batch":  # a worker stashes its warm-up + 1 versions (2-1: [2, 2, 1])
            assert peak == pipedream_warmup(2, stage, replicas) + 1, (rank, peak)
        for step, (got, want) in enumerate(zip(losses, want_losses)):  # every rank logs it
            assert abs(got - want) <= TOLERANCE * abs(want), (rank, step, losses, want_losses)
        _assert_weights_close(weights, want_weights[stage], stage)
        for step, want in want_norms[stage].items():  # steps in which the stage updated
            if step == STEPS - 1:  # the last step's final updates come with the drain
                continue
            assert abs(norms[step] - want) <= TOLERANCE * want, (rank, step, norms, want_norms)


def test_step_updates_without_staleness_in_the_first_step() -> None:
    """Updating once per step, the first step's forwards all use the initial weights: its loss
    is the flushed schedule's (the reference's first value), not a stale one."""
    config = _config(2, pipeline_layers=[2, 2], pipedream_update="step")
    flushed = replace(config, parallel=replace(config.parallel, pipeline_schedule="1f1b"))
    got = run_distributed(_pipeline, 2, config, pipeline=2)[-1][0]
    want = run_distributed(_pipeline, 2, flushed, pipeline=2)[-1][0]
    assert abs(got[0] - want[0]) <= TOLERANCE * abs(want[0])
    assert abs(got[1] - want[1]) > TOLERANCE * abs(want[1])  # then the stages drift apart


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"pipeline_schedule": "1f1b"},
            r"replicas=\[2, 1\] replicates pipeline stages, which only",
        ),
        ({"pipedream_vertical_sync": True}, r"does not support parallel.pipedream_vertical_sync"),
        ({"pipeline_replicas": [3, 1]}, r"every count must divide it; \[3\] do not"),
        ({"pipeline_split": "pipedream"}, r"chooses the replicas itself; leave"),
        ({"finetuning": True}, r"replicated pipeline stages are for pretraining runs"),
    ],
)
def test_invalid_replication_settings_are_named(change: dict, message: str) -> None:
    config = _config(2, pipeline_replicas=[2, 1])
    finetuning = change.pop("finetuning", False)
    parallel = replace(config.parallel, **change)
    with pytest.raises(ValueError, match=message):
        validate_replication(parallel, 4, finetuning=finetuning)
    validate_replication(config.parallel, 4)  # the valid one passes


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"pipeline": 1}, r"needs parallel.pipeline >= 2 \(got 1\)"),
        ({"precision": "fp16"}, r"does not support parallel.precision=fp16"),
    ],
)
def test_invalid_pipedream_settings_are_named(change: dict, message: str) -> None:
    config = _config(2)
    parallel = replace(config.parallel, **{k: v for k, v in change.items() if k != "pipeline"})
    with pytest.raises(ValueError, match=message):
        validate_pipedream(parallel, change.get("pipeline", 2), compiled=False)
    with pytest.raises(ValueError, match=r"does not support trainer.compile=true"):
        validate_pipedream(config.parallel, 2, compiled=True)


# ----------------------------------------------------------------------------- training loop


def _train(ctx: ParallelContext, config: Config, run_dir: str, trainer: dict) -> tuple:
    """Pretrain (BERT, pipedream at pipeline=2) and return the step losses and this stage's
    live weights after the run (drained by the save or the end)."""
    config = replace(config, trainer=replace(config.trainer, **trainer))
    run = pretraining_trainer(config, ctx, Path(run_dir))
    records = run.train()
    state = run.engine.state_dict()
    return {r["step"]: r["loss"] for r in records}, {
        k: v.clone() for k, v in state.items() if k.startswith("param/")
    }


@pytest.mark.slow  # over ~5 s: the slow tier
def test_training_loop_checkpoints_the_drained_weights_and_resumes(tmp_path: Path) -> None:
    """A save drains the pipeline: the checkpoint holds every stage's weights after all
    micro-batches' updates, the tied word embedding as the first stage wrote it (the last
    stage's own copy, trained apart, is not saved); a resume continues from there."""
    config = pipeline_config(micro=2, accum=4, pipeline=2, pipeline_schedule="pipedream")
    config = replace(config, trainer=replace(config.trainer, max_steps=4))
    run = str(tmp_path / "run")
    (_, first_state), (last, last_state) = run_distributed(
        _train, 2, config, run, {"exit_at_step": 2}, pipeline=2
    )
    assert sorted(last) == [1, 2] and all(math.isfinite(v) for v in last.values())
    tied = "param/bert.embeddings.word_embeddings.weight"
    assert not torch.equal(first_state[tied], last_state[tied])  # the copies trained apart
    saved = {k: torch.empty_like(v) for k, v in {**last_state, **first_state}.items()}
    store.load(tmp_path / "run" / "checkpoints" / store.step_dir_name(2), {"engine": saved})
    for name, value in {**last_state, **first_state}.items():  # the first stage's tied copy
        assert torch.equal(saved[name], value), name
    resumed = run_distributed(_train, 2, config, run, {"resume": "auto"}, pipeline=2)[-1][0]
    assert sorted(resumed) == [3, 4] and all(math.isfinite(v) for v in resumed.values())


@pytest.mark.slow  # over ~5 s: the slow tier
def test_replicated_run_checkpoints_and_resumes(tmp_path: Path) -> None:
    """A "2-1" run (3 ranks) saves after its drain: the two replicas of stage 0 hold the same
    weights, the checkpoint holds them and the last stage's, and a resume continues."""
    config = pipeline_config(
        micro=2, accum=4, pipeline=2, pipeline_schedule="pipedream", pipeline_replicas=[2, 1]
    )
    config = replace(config, trainer=replace(config.trainer, max_steps=4))
    run = str(tmp_path / "run")
    (_, first), (_, second), (losses, last) = run_distributed(
        _train, 3, config, run, {"exit_at_step": 2}, pipeline=2, replicas=[2, 1]
    )
    assert sorted(losses) == [1, 2] and all(math.isfinite(v) for v in losses.values())
    assert first.keys() == second.keys()
    for name, value in first.items():
        assert torch.equal(value, second[name]), name  # the replicas update together
    saved = {k: torch.empty_like(v) for k, v in {**last, **first}.items()}
    store.load(tmp_path / "run" / "checkpoints" / store.step_dir_name(2), {"engine": saved})
    for name, value in {**last, **first}.items():
        assert torch.equal(saved[name], value), name
    resumed = run_distributed(
        _train, 3, config, run, {"resume": "auto"}, pipeline=2, replicas=[2, 1]
    )[-1][0]
    assert sorted(resumed) == [3, 4] and all(math.isfinite(v) for v in resumed.values())
