"""What every tpformer model is: a TP module that carries its architecture's ModelConfig."""

from __future__ import annotations

from torch import Tensor, nn

from tpformer.config.schema import ModelConfig
from tpformer.layers.base import TPModule


class TPModel(TPModule):
    """Base of BertModel, BertForPreTraining, BertForSequenceClassification, GPTModel and
    GPTForCausalLM: `config` is the architecture the model was built from (what export, the
    pipeline split and fine-tuning read)."""

    config: ModelConfig

    def blocks(self) -> list[nn.Module]:
        """The repeated units (transformer layers) the engine buckets and recomputation wraps,
        in forward order; each model names its own."""
        raise NotImplementedError(f"{type(self).__name__} does not name its blocks")

    def block_positions(
        self, position_ids: Tensor | None = None, **_: Tensor | None
    ) -> Tensor | None:
        """What every block gets as positions besides the activation and the mask: packed
        documents' [b, s] (data.pack; rotary embeddings restart per document), else None (each
        row's place in the sequence)."""
        return position_ids
