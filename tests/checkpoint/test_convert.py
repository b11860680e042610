"""tpformer-convert (tpformer.cli.convert): tpformer checkpoint <-> Hugging Face directory."""

from dataclasses import replace
from pathlib import Path

import pytest
import torch
import transformers

from tests.cli.forked import convert
from tests.tolerances import assert_rel_close
from tests.train.test_trainer import tiny_config
from tpformer.parallel.comm import gather_from_tp
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer


@pytest.mark.slow
def test_checkpoint_to_hf_and_back(tmp_path: Path) -> None:
    config = tiny_config(steps=2)
    config = replace(config, trainer=replace(config.trainer, save_every=2))
    ctx = ParallelContext.single(device="cpu")
    trainer = pretraining_trainer(config, ctx, tmp_path / "run")
    trainer.train()
    checkpoint = tmp_path / "run" / "checkpoints" / "step00000002"
    convert("to-hf", str(checkpoint), str(tmp_path / "hf"))

    hf = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf").eval()
    ids = torch.randint(5, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    model = trainer.model.eval()
    with torch.no_grad():
        ours = gather_from_tp(model(ids).mlm_logits, ctx.tp)[..., :128]
        theirs = hf(input_ids=ids).prediction_logits
    assert_rel_close(ours, theirs, 1e-5, "logits after to-hf")

    convert("from-hf", str(tmp_path / "hf"), str(tmp_path / "back"))
    back = tmp_path / "back" / "checkpoints" / "step00000000"
    convert("to-hf", str(back), str(tmp_path / "hf2"))
    again = transformers.BertForPreTraining.from_pretrained(tmp_path / "hf2").state_dict()
    for key, tensor in hf.state_dict().items():
        assert torch.equal(again[key], tensor), key
