"""Parameter metadata is one typed record (parallel/param_info.py), set by the layers and the
pipeline stage and still there after the engine has made the parameters views of its buffers."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from tests.dist import run_distributed
from tests.models.common import tiny_gpt
from tpformer.config.schema import OptimConfig, ParallelConfig
from tpformer.engine.parallelize import parallelize
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import logical_shape, mark_sharded
from tpformer.parallel.param_info import ParamInfo, param_info, update_param_info


def test_an_unmarked_parameter_is_replicated_and_a_mark_is_typed() -> None:
    param = nn.Parameter(torch.zeros(5, 3))
    assert param_info(param) == ParamInfo()
    assert logical_shape(param) == torch.Size([5, 3])
    mark_sharded(param, 0, 9)
    assert param_info(param) == ParamInfo(tp_dim=0, logical_size=9)
    assert logical_shape(param) == torch.Size([9, 3])
    with pytest.raises(TypeError, match="tp_rank"):
        update_param_info(param, tp_rank=1)
    with pytest.raises(AttributeError):  # frozen: one writer, update_param_info
        param_info(param).tp_dim = 1  # type: ignore[misc]


def _records(ctx: ParallelContext) -> dict[str, tuple[ParamInfo, list[str]]]:
    """After parallelize (parameters become views of the engine's flat buffers): this stage's
    parameters, each with its record (less its init function, a closure) and any other
    attribute it carries."""
    model = build_model(tiny_gpt(), ctx, task="causal_lm")
    parallel = ParallelConfig(tensor=2, pipeline=2, zero_stage=1, sequence_parallel=True)
    layers = model.config.num_layers
    parallelize(model, parallel, OptimConfig(), ctx, split=[layers // 2, layers - layers // 2])
    plain = set(nn.Parameter(torch.zeros(1)).__dict__) | {"tpformer_param_info"}
    return {
        name: (replace(param_info(p), init=None), sorted(set(p.__dict__) - plain))
        for name, p in model.named_parameters()
    }


def test_the_layers_and_stages_mark_their_parameters_in_the_record() -> None:
    """GPT at TP=2 with sequence parallelism on 2 pipeline stages, ZeRO-1."""
    results = run_distributed(_records, 4, tensor=2, pipeline=2, sequence_parallel=True)
    for rank, records in enumerate(results):
        first_stage = rank < 2
        assert all(not extra for _, extra in records.values()), records
        infos = {name: info for name, (info, _) in records.items()}
        wte = infos["transformer.wte.weight"]  # on both ends: tied, counted once
        assert wte.tp_dim == 0 and wte.logical_size == tiny_gpt().vocab_size
        assert wte.pipeline_tied and wte.counted_in_norm == first_stage
        norms = [info for name, info in infos.items() if "norm." in name]
        assert norms and all(i.sequence_parallel and i.tp_dim is None for i in norms)
        fc_in = [info for name, info in infos.items() if name.endswith("fc_in.weight")]
        fc_out = [info for name, info in infos.items() if name.endswith("fc_out.weight")]
        assert fc_in and all(i.tp_dim == 0 and not i.sequence_parallel for i in fc_in)
        assert fc_out and all(i.tp_dim == 1 and not i.pipeline_tied for i in fc_out)
        assert all(not i.pipeline_tied for n, i in infos.items() if n != "transformer.wte.weight")
