"""ZeRO 0-3 with and without offload and accumulation against single-process torch.optim.AdamW."""

from dataclasses import replace

import pytest
import torch

from tests.dist import run_distributed
from tests.models.common import tiny_bert
from tests.tolerances import FP32_LAYER_REL, assert_rel_close, seeded
from tpformer.config.rules.parallel import validate_engine
from tpformer.config.schema import OptimConfig, ParallelConfig
from tpformer.engine import build_engine
from tpformer.engine.memory import zero_memory_bytes
from tpformer.engine.optimizer import DeviceAdamW
from tpformer.engine.units import bucket_elements
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import full_state_dict

ADAMW_REL = 1e-5
"""5 fp32 AdamW steps; gradients summed over DP ranks and micro-batches in another order."""
GLOBAL_BATCH, SEQ, STEPS, LABELS = 8, 10, 5, 3
# Clip below the norm so clipping is always on. eps=1e-6: Adam divides by sqrt(v) + eps, which
# turns reduction-order noise in gradients that are truly zero (the key bias: softmax ignores it)
# into full-size updates when eps is tiny; 1e-6 keeps that noise below the tolerance.
OPTIM = OptimConfig(lr=3e-3, weight_decay=0.1, clip_grad=0.5, eps=1e-6)
CASES = [
    (stage, offload, accum)
    for stage in (0, 1, 2, 3)
    for offload in ("none", "optimizer")
    for accum in (1, 2)
] + [(3, "optimizer+params", 2)]


def _batch(step: int) -> dict[str, torch.Tensor]:
    g = seeded(100 + step)
    ids = torch.randint(5, 99, (GLOBAL_BATCH, SEQ), generator=g)
    mask = torch.ones_like(ids)
    mask[::3, 7:] = 0
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "labels": torch.randint(0, LABELS, (GLOBAL_BATCH,), generator=g),
    }


def _model(ctx: ParallelContext):
    return build_model(tiny_bert(dropout=0.1), ctx, task="classification", num_labels=LABELS)


def reference_params() -> dict[str, torch.Tensor]:
    """The single-process model and torch.optim.AdamW on the whole global batch."""
    ctx = ParallelContext.single(device="cpu")
    model = _model(ctx)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": OPTIM.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=OPTIM.lr,
        betas=(OPTIM.beta1, OPTIM.beta2),
        eps=OPTIM.eps,
    )
    for step in range(STEPS):
        ctx.rng.set_position(step, 0)
        model(**_batch(step)).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), OPTIM.clip_grad)
        opt.step()
        opt.zero_grad()
    return full_state_dict(model, ctx.tp)


def _train(
    ctx: ParallelContext, stage: int, offload: str, accum: int, bucket_mb: float = 0.0
) -> dict[str, torch.Tensor]:
    model = _model(ctx)
    parallel = ParallelConfig(zero_stage=stage, cpu_offload=offload, bucket_mb=bucket_mb)
    engine = build_engine(model, OPTIM, parallel, ctx)
    per_rank = GLOBAL_BATCH // ctx.dp.size
    micro = per_rank // accum
    for step in range(STEPS):
        batch = _batch(step)
        for m in range(accum):
            first = ctx.dp.rank * per_rank + m * micro
            ctx.rng.set_position(step, first)
            loss = model(**{k: v[first : first + micro] for k, v in batch.items()}).loss
            engine.backward(loss / (accum * ctx.dp.size), sync=m == accum - 1)
        engine.step()
    with engine.gathered():
        return full_state_dict(model, ctx.tp)


def _all_cases(ctx: ParallelContext) -> list[dict[str, torch.Tensor]]:
    return [_train(ctx, *case) for case in CASES]


@pytest.fixture(scope="module")
def reference() -> dict[str, torch.Tensor]:
    return reference_params()


@pytest.mark.sweep
@pytest.mark.parametrize(("tp", "dp"), [(2, 1), (1, 2), (2, 2), (1, 4)])
def test_zero_matches_single_process_adamw(reference, tp: int, dp: int) -> None:
    results = run_distributed(_all_cases, tp * dp, tensor=tp)
    for rank_result in results:
        for case, params in zip(CASES, rank_result):
            for name, expected in reference.items():
                assert_rel_close(params[name], expected, ADAMW_REL, f"{case} {name}")
    # the training moved the parameters well beyond the tolerance
    initial = full_state_dict(
        _model(ParallelContext.single(device="cpu")), ParallelContext.single().tp
    )
    moved = max((initial[k] - v).abs().max().item() for k, v in reference.items())
    assert moved > 100 * ADAMW_REL


def _memory(ctx: ParallelContext) -> list[tuple]:
    reports = []
    for stage in (0, 1, 2, 3):
        model = _model(ctx)
        n_params = sum(p.numel() for p in model.parameters())
        engine = build_engine(model, OPTIM, ParallelConfig(zero_stage=stage), ctx)
        ctx.rng.set_position(0, 0)
        batch = {k: v[:2] for k, v in _batch(0).items()}
        engine.backward(model(**batch).loss)
        engine.step()
        padding = sum(b.padded_numel - b.numel for b in engine.buckets)
        reports.append(
            (
                stage,
                engine.memory_report(),
                zero_memory_bytes(stage, n_params, ctx.dp.size),
                padding,
            )
        )
    return reports


@pytest.mark.parametrize(("tp", "dp"), [(1, 2), (2, 2), (1, 4)])
def test_memory_matches_zero_formula(tp: int, dp: int) -> None:
    for stage, measured, formula, padding in run_distributed(_memory, tp * dp, tensor=tp)[0]:
        for field in ("params", "grads", "optimizer"):
            got, want = getattr(measured, field), getattr(formula, field)
            slack = 0.05 * want + padding * 12  # padding elements, at most 12 bytes each
            assert abs(got - want) <= slack, f"stage {stage} {field}: {got} vs formula {want}"
        if stage:
            assert measured.total < formula.total * 2  # sanity: not the DDP figure


def test_bad_engine_settings_raise() -> None:
    """The one validator (run at the entry point) rejects them; the engine takes typed values."""
    with pytest.raises(ValueError, match=r"parallel.zero_stage=4 is not one of \[0, 1, 2, 3\]"):
        validate_engine(ParallelConfig(zero_stage=4), OPTIM, "cpu")
    with pytest.raises(ValueError, match=r"optimizer\+params needs parallel.zero_stage=3"):
        validate_engine(ParallelConfig(zero_stage=2, cpu_offload="optimizer+params"), OPTIM, "cpu")
    with pytest.raises(
        ValueError, match=r"optim.name='sgd' is not one of \['adamw', 'lamb', 'lars', 'novograd'\]"
    ):
        validate_engine(ParallelConfig(cpu_offload="optimizer"), replace(OPTIM, name="sgd"), "cpu")
    with pytest.raises(ValueError, match="precision=fp16 needs a GPU"):
        validate_engine(ParallelConfig(precision="fp16"), OPTIM, "cpu")


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_nonfinite_loss_stops_with_the_step_count(precision: str) -> None:
    """Skipped (weights unchanged) until the max_nonfinite_steps-th consecutive one, which
    stops the run, in every precision (fp16 with its loss scaler runs on a GPU only)."""
    ctx = ParallelContext.single(device="cpu")
    model = _model(ctx)
    engine = build_engine(
        model, replace(OPTIM, max_nonfinite_steps=3), ParallelConfig(precision=precision), ctx
    )
    batch = _batch(0)
    before = {k: v.clone() for k, v in full_state_dict(model, ctx.tp).items()}
    for _ in range(2):
        engine.backward(model(**batch).loss * float("nan"))
        assert engine.step()["skipped"] == 1.0
    after = full_state_dict(model, ctx.tp)
    assert all(torch.equal(before[k], after[k]) for k in before), "a skipped step changed weights"
    engine.backward(model(**batch).loss * float("inf"))
    with pytest.raises(FloatingPointError, match="non-finite gradients for 3 consecutive steps"):
        engine.step()


@pytest.mark.parametrize("name", ["adamw", "lamb", "lars", "novograd"])
def test_a_nonfinite_step_is_skipped_on_the_device(name: str) -> None:
    """After a clean step (slots non-zero), a NaN gradient leaves weights, moments and step
    counts exactly as they were: the optimizer's own device-side skip (found_inf), no host
    read of the norm in queue_step."""
    ctx = ParallelContext.single(device="cpu")
    model = _model(ctx)
    engine = build_engine(model, replace(OPTIM, name=name), ParallelConfig(zero_stage=1), ctx)
    engine.backward(model(**_batch(0)).loss)
    assert engine.step()["skipped"] == 0.0
    before = {k: v.clone() for k, v in engine.state_dict().items() if k != "nonfinite_steps"}
    engine.backward(model(**_batch(1)).loss * float("nan"))
    assert engine.step()["skipped"] == 1.0
    after = engine.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert not changed, changed


def test_fp16_loss_scaler_decides_on_the_device_inside_the_engine() -> None:
    """fp16 through the engine (it runs on the CPU too; the CLI validator keeps fp16 for GPUs):
    the scale multiplies the loss and is divided out of the reported norm (fp32's first norm to
    fp16 precision), a NaN step is skipped with every state tensor unchanged and halves the
    scale, and `loss_scale_window` clean steps double it, all as device tensors."""
    optim = replace(OPTIM, initial_loss_scale=1024.0, loss_scale_window=2)
    norms = {}
    for precision in ("fp32", "fp16"):
        ctx = ParallelContext.single(device="cpu")
        model = _model(ctx)
        engine = build_engine(model, optim, ParallelConfig(precision=precision), ctx)
        engine.backward(model(**_batch(0)).loss)
        norms[precision] = engine.step()["grad_norm"]
    assert norms["fp16"] == pytest.approx(norms["fp32"], rel=1e-2)  # fp16 activations
    assert isinstance(engine.scaler.scale, torch.Tensor)
    assert (float(engine.scaler.scale), int(engine.scaler.clean_steps)) == (1024.0, 1)
    before = {k: v.clone() for k, v in engine.state_dict().items() if k != "nonfinite_steps"}
    engine.backward(model(**_batch(1)).loss * float("nan"))
    assert engine.step()["skipped"] == 1.0
    after = engine.state_dict()
    changed = [k for k in before if k not in ("loss_scale", "clean_steps")]
    assert all(torch.equal(before[k], after[k]) for k in changed)
    assert float(engine.scaler.scale) == 512.0
    for step in (2, 3):
        engine.backward(model(**_batch(step)).loss)
        assert engine.step()["skipped"] == 0.0
    assert float(engine.scaler.scale) == 1024.0


def test_device_adamw_follows_torch_adamw_and_skips_on_found_inf() -> None:
    """DeviceAdamW (devices without a fused AdamW, e.g. a dry run's meta device) against
    torch's AdamW over 4 steps with weight decay, a skipped first step included (its state is
    created as zeros and the step count stays 0)."""
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(5)), torch.nn.Parameter(torch.randn(3, 2))]
    twins = [torch.nn.Parameter(p.detach().clone()) for p in params]
    ours = DeviceAdamW(
        [{"params": params, "weight_decay": 0.1}], lr=0.1, betas=(0.9, 0.99), eps=1e-8
    )
    torch_adamw = torch.optim.AdamW(twins, lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    ours.found_inf = torch.tensor(1.0)
    ours.step()
    assert all(torch.equal(p, q) for p, q in zip(params, twins, strict=True))
    assert all(not bool(v.ne(0).any()) for st in ours.state.values() for v in st.values())
    ours.found_inf = torch.tensor(0.0)
    for step in range(4):
        for p, q in zip(params, twins, strict=True):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(step))
            q.grad = p.grad.clone()
        ours.step()
        torch_adamw.step()
    for p, q in zip(params, twins, strict=True):
        assert_rel_close(p, q, FP32_LAYER_REL, "DeviceAdamW vs torch AdamW")


def _losses(precision: str) -> list[float]:
    ctx = ParallelContext.single(device="cpu")
    model = _model(ctx)
    engine = build_engine(model, OPTIM, ParallelConfig(precision=precision, zero_stage=1), ctx)
    if precision == "bf16":
        assert next(model.parameters()).dtype == torch.bfloat16
        assert engine.masters[0].values.dtype == torch.float32
    losses = []
    for step in range(10):
        ctx.rng.set_position(step, 0)
        loss = model(**_batch(0)).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


BF16_LOSS_ABS = 0.05
"""bf16 keeps 8 mantissa bits: losses of order 1 follow fp32 to a few hundredths."""


def test_bf16_follows_fp32_with_fp32_masters() -> None:
    fp32, bf16 = _losses("fp32"), _losses("bf16")
    assert fp32[-1] < fp32[0] - 0.1, fp32  # it learns the batch
    assert max(abs(a - b) for a, b in zip(fp32, bf16)) < BF16_LOSS_ABS, (fp32, bf16)


def _overlap(ctx: ParallelContext) -> dict[str, int]:
    from tpformer.parallel.comm import count_collectives

    model = _model(ctx)
    engine = build_engine(model, OPTIM, ParallelConfig(zero_stage=0), ctx)
    batch = {k: v[:2] for k, v in _batch(0).items()}
    with count_collectives() as no_sync:
        engine.backward(model(**batch).loss, sync=False)
    with count_collectives() as during_backward:
        engine.backward(model(**batch).loss, sync=True)
    engine.step()
    return {
        "no_sync": no_sync["all_reduce"],
        "backward": during_backward["all_reduce"],
        "buckets": len(engine.buckets),
    }


def test_gradients_are_reduced_during_backward_once_per_bucket() -> None:
    for counts in run_distributed(_overlap, 2, tensor=1):
        assert counts["no_sync"] == 0
        assert counts["backward"] == counts["buckets"] == 3  # 2 layers + the rest


def _whole_gradients_at_once(ctx: ParallelContext) -> dict[int, int]:
    """The most buckets holding a whole (unreduced) gradient buffer at any point of backward."""
    most = {}
    for stage in (2, 3):
        model = build_model(tiny_bert(num_layers=6), ctx, task="classification", num_labels=LABELS)
        engine = build_engine(model, OPTIM, ParallelConfig(zero_stage=stage), ctx)
        seen = [0]

        def count(param: torch.Tensor, engine=engine, seen=seen) -> None:
            seen[0] = max(seen[0], engine.grads.whole_buffers_held())

        for p in model.parameters():  # runs after the engine's own hook on the same parameter
            p.register_post_accumulate_grad_hook(count)
        batch = {k: v[:2] for k, v in _batch(0).items()}
        for _ in range(2):  # two steps of two micro-batches
            engine.backward(model(**batch).loss, sync=False)
            engine.backward(model(**batch).loss)
            engine.step()
        most[stage] = seen[0]
    return most


@pytest.mark.parametrize("dp", [2, 4])
def test_whole_gradients_are_freed_as_they_are_reduced(dp: int) -> None:
    """Stages 2-3 keep only shards: a layer's whole gradient goes back to the pool once its
    reduce-scatter is done, so the root bucket's and at most two layers' coexist (the one
    in flight and the one filling), not all six, also with gradient accumulation: every
    micro-batch is reduce-scattered into the shard (dp=2 runs the point-to-point exchange,
    whose gloo work never reports completion before it is waited for)."""
    for most in run_distributed(_whole_gradients_at_once, dp, tensor=1):
        assert most == {2: 3, 3: 3}


def _reductions_per_micro_batch(ctx: ParallelContext) -> dict[int, list[int]]:
    from tpformer.parallel.comm import count_collectives

    counts = {}
    for stage in (1, 2, 3):
        model = _model(ctx)
        engine = build_engine(model, OPTIM, ParallelConfig(zero_stage=stage), ctx)
        batch = {k: v[:2] for k, v in _batch(0).items()}
        with count_collectives() as first:
            engine.backward(model(**batch).loss, sync=False)
        with count_collectives() as last:
            engine.backward(model(**batch).loss)
            engine.step()
        counts[stage] = [first["reduce_scatter"], last["reduce_scatter"], len(engine.buckets)]
    return counts


def test_stages_two_and_three_reduce_every_micro_batch() -> None:
    """Stage 1 accumulates whole gradients and reduce-scatters once per step; stages 2-3
    reduce-scatter each bucket in every micro-batch (what their memory formula and the
    planner's time assume)."""
    for counts in run_distributed(_reductions_per_micro_batch, 2, tensor=1):
        buckets = counts[1][2]
        assert counts[1][:2] == [0, buckets], counts
        assert counts[2][:2] == [buckets, buckets], counts
        assert counts[3][:2] == [buckets, buckets], counts


LAMB = replace(OPTIM, name="lamb", lr=1e-2)


def lamb_reference() -> dict[str, torch.Tensor]:
    """LAMB written out per parameter on the single-process model (the paper's Algorithm 2 with
    AdamW's bias correction): w -= lr * ||w|| / ||u|| * u, u = Adam update + decay * w."""
    ctx = ParallelContext.single(device="cpu")
    model = _model(ctx)
    state = {p: (torch.zeros_like(p), torch.zeros_like(p)) for p in model.parameters()}
    b1, b2 = LAMB.beta1, LAMB.beta2
    for step in range(1, STEPS + 1):
        ctx.rng.set_position(step - 1, 0)
        model(**_batch(step - 1)).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), LAMB.clip_grad)
        with torch.no_grad():
            for p in model.parameters():
                m, v = state[p]
                m.mul_(b1).add_(p.grad, alpha=1 - b1)
                v.mul_(b2).add_(p.grad * p.grad, alpha=1 - b2)
                u = (m / (1 - b1**step)) / ((v / (1 - b2**step)).sqrt() + LAMB.eps)
                if p.dim() >= 2:
                    u = u + LAMB.weight_decay * p
                w_norm, u_norm = p.norm(), u.norm()
                trust = (w_norm / u_norm).item() if w_norm > 0 and u_norm > 0 else 1.0
                p.sub_(LAMB.lr * trust * u)
                p.grad = None
    return full_state_dict(model, ctx.tp)


def engine_cases(
    ctx: ParallelContext, optim: OptimConfig, cases: list[tuple[int, str]]
) -> list[dict[str, torch.Tensor]]:
    """STEPS steps of the engine with `optim` per (zero stage, offload): the full parameters."""
    results = []
    for stage, offload in cases:
        model = _model(ctx)
        engine = build_engine(
            model, optim, ParallelConfig(zero_stage=stage, cpu_offload=offload), ctx
        )
        per_rank = GLOBAL_BATCH // ctx.dp.size
        for step in range(STEPS):
            first = ctx.dp.rank * per_rank
            ctx.rng.set_position(step, first)
            batch = {k: v[first : first + per_rank] for k, v in _batch(step).items()}
            engine.backward(model(**batch).loss / ctx.dp.size)  # this rank's share of the mean
            engine.step()
        with engine.gathered():
            results.append(full_state_dict(model, ctx.tp))
    return results


def _lamb_cases(ctx: ParallelContext) -> list[dict[str, torch.Tensor]]:
    return engine_cases(ctx, LAMB, [(0, "none"), (1, "none"), (2, "optimizer"), (3, "none")])


@pytest.mark.parametrize(("tp", "dp"), [(1, 1), (2, 2), (1, 4)])
def test_lamb_matches_per_parameter_reference(tp: int, dp: int) -> None:
    """Trust ratios need whole-parameter norms: pieces over views, DP shards and TP ranks."""
    reference = lamb_reference()
    adamw = reference_params()
    assert max((adamw[k] - v).abs().max().item() for k, v in reference.items()) > 1e-3
    for rank_result in run_distributed(_lamb_cases, tp * dp, tensor=tp):
        for case, params in enumerate(rank_result):
            for name, expected in reference.items():
                assert_rel_close(params[name], expected, ADAMW_REL, f"lamb case {case} {name}")


def _layers_a_b() -> tuple[torch.nn.ModuleDict, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.ModuleDict({"a": torch.nn.Linear(4, 4), "b": torch.nn.Linear(4, 4)})
    return model, torch.randn(8, 4, generator=seeded(1))


def _two_steps_second_without_b(ctx: ParallelContext, stage: int) -> list[float]:
    """Step 1 backpropagates through layers a and b, step 2 through a only (lr 0: the weights
    stay put). Returns the gradient norm of each step as the engine computed it."""
    model, x = _layers_a_b()
    engine = build_engine(
        model, replace(OPTIM, lr=0.0, clip_grad=0.0), ParallelConfig(zero_stage=stage), ctx
    )
    norms = []
    for through_b in (True, False):
        y = model["a"](x)
        loss = (model["b"](y) if through_b else y).square().mean()
        engine.backward(loss / ctx.dp.size)  # every rank the same batch: the sum is the mean
        norms.append(engine.step()["grad_norm"])
    return norms


@pytest.mark.parametrize(("world", "stage"), [(1, 0), (2, 0), (2, 1)])
def test_a_parameter_without_gradient_this_step_counts_as_zero(world: int, stage: int) -> None:
    """The gradient buffers are not zeroed between steps (a step's first gradient is copied
    over the last one's): b's step-1 gradient must not leak into step 2."""
    model, x = _layers_a_b()
    want = []
    for through_b in (True, False):
        model.zero_grad(set_to_none=True)
        y = model["a"](x)
        (model["b"](y) if through_b else y).square().mean().backward()
        grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
        want.append(float(torch.cat(grads).norm()))
    got = (
        _two_steps_second_without_b(ParallelContext.single(device="cpu"), stage)
        if world == 1
        else run_distributed(_two_steps_second_without_b, world, stage)[0]
    )
    assert got == pytest.approx(want, rel=1e-6)


BUCKET_MB = 0.008
"""About 2,100 fp32 elements: tiny_bert's blocks (about 8,400 parameters at TP=1) are cut into
several buckets, and the QKV matrix (3,072) is a bucket of its own."""


def _bucketed(ctx: ParallelContext) -> list:
    results = [_train(ctx, stage, "none", 2, BUCKET_MB) for stage in (0, 1, 2, 3)]
    results.append(_train(ctx, 3, "optimizer+params", 1, BUCKET_MB))
    model = _model(ctx)
    engine = build_engine(model, OPTIM, ParallelConfig(bucket_mb=BUCKET_MB), ctx)
    blocks = sum(1 for _ in model.blocks())
    singles = [b.numel for b in engine.buckets if len(b.segments) == 1]
    cap = bucket_elements(BUCKET_MB)
    sizes = [b.numel for b in engine.buckets]
    return [results, blocks, sizes, cap, singles]


@pytest.mark.parametrize(("tp", "dp"), [(1, 2), pytest.param(2, 2, marks=pytest.mark.slow)])
def test_small_buckets_match_single_process_adamw(reference, tp: int, dp: int) -> None:
    """parallel.bucket_mb cuts blocks into buckets at parameter boundaries: every stage (with
    accumulation, and ZeRO-3 with its parameters offloaded) still equals torch.optim.AdamW on
    one process; no bucket exceeds the cap unless it is one parameter. (ZeRO-3 frees a block's
    parameters after its forward; autograd's views of them, such as a linear layer's saved
    transposed weight, must find them again in backward: they share the bucket's storage,
    which is released and re-allocated rather than swapped for another buffer.)"""
    for results, blocks, sizes, cap, singles in run_distributed(_bucketed, tp * dp, tensor=tp):
        assert len(sizes) > blocks + 1, sizes  # the blocks were cut
        assert all(size <= cap or size in singles for size in sizes), (sizes, cap)
        for params in results:
            for name, expected in reference.items():
                assert_rel_close(params[name], expected, ADAMW_REL, name)


def _most_whole_gradient(ctx: ParallelContext) -> dict[float, int]:
    """The most elements of whole (unreduced) gradient buffers held at once during two steps
    of two micro-batches at ZeRO-2 and 3, by bucket_mb."""
    most = {}
    for stage, bucket_mb in ((2, 0.0), (2, BUCKET_MB), (3, 0.0), (3, BUCKET_MB)):
        model = build_model(tiny_bert(num_layers=6), ctx, task="classification", num_labels=LABELS)
        parallel = ParallelConfig(zero_stage=stage, bucket_mb=bucket_mb)
        engine = build_engine(model, OPTIM, parallel, ctx)
        seen = [0]

        def count(param: torch.Tensor, engine=engine, seen=seen) -> None:
            held = sum(w.numel() for w in engine.grads.whole if w is not None)
            seen[0] = max(seen[0], held)

        for p in model.parameters():
            p.register_post_accumulate_grad_hook(count)
        batch = {k: v[:2] for k, v in _batch(0).items()}
        for _ in range(2):
            engine.backward(model(**batch).loss, sync=False)
            engine.backward(model(**batch).loss)
            engine.step()
        most[(stage, bucket_mb)] = seen[0]
    return most


def test_small_buckets_hold_less_whole_gradient() -> None:
    """With 8 KiB buckets ZeRO-2 and 3 hold less than half the whole gradient they hold with
    one bucket per block (the root's and two layers')."""
    for most in run_distributed(_most_whole_gradient, 2, tensor=1):
        for stage in (2, 3):
            assert most[(stage, BUCKET_MB)] < most[(stage, 0.0)] / 2, most
