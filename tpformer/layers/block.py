"""TransformerLayer (post- or pre-LayerNorm) and TransformerStack.

LayerNorms and the row-parallel biases are replicated across TP; a layer issues exactly two
all-reduces forward (attention and MLP outputs) and two backward (their inputs). With sequence
parallelism the layer's input and output are [b, s/tp, h]: LayerNorms, dropouts and residual
adds run on this rank's chunk of the sequence, and each all-reduce becomes an all-gather at the
column-parallel input and a reduce-scatter at the row-parallel output.
"""

from __future__ import annotations

from torch import Tensor, nn

from tpformer.config.schema import ModelConfig
from tpformer.layers.attention import ParallelSelfAttention
from tpformer.layers.dropout import ParallelDropout
from tpformer.layers.kv_cache import KVCache
from tpformer.layers.mlp import ParallelMLP
from tpformer.layers.norm import make_norm
from tpformer.layers.rotary import Rotary
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import mark_sequence_parallel


class TransformerLayer(nn.Module):
    """post-norm (BERT): x = N(x + drop(attn(x))); x = N(x + drop(mlp(x))).
    pre-norm (GPT-2, Llama, ModernBERT): x = x + drop(attn(N(x))); x = x + drop(mlp(N(x))).
    N is the config's norm (LayerNorm, RMSNorm), placed as config.norm.position says. Layer
    `index` of a pre-norm encoder (ModernBERT) skips the first layer's attention norm (its input
    is the normalized embeddings) and attends locally as config.is_local says, with the local
    rotary base."""

    def __init__(
        self,
        config: ModelConfig,
        ctx: ParallelContext,
        *,
        causal: bool,
        index: int = 0,
    ) -> None:
        super().__init__()
        self.pre_norm = pre_norm = config.norm.position == "pre"
        h, sp = config.hidden_size, ctx.sequence_parallel
        sequence = ctx.tp if sp else None
        local = config.window_of(index)
        rotary = None
        if config.rotary is not None:
            rotary = Rotary(
                config.rotary,
                h // config.num_heads,
                config.max_position_embeddings,
                local=bool(local),
            )
        self.attention = ParallelSelfAttention(
            h,
            config.num_heads,
            ctx,
            causal=causal,
            attention_dropout=config.attention_dropout,
            kv_heads=config.kv_heads,
            bias=config.bias,
            qkv_bias=config.bias or config.qkv_bias,
            rotary=rotary,
            window=local.window if local else 0,
        )
        self.attention_dropout = ParallelDropout(
            config.dropout, ctx.rng, sequence=sequence, context=ctx.cp
        )
        skip = pre_norm and not causal and index == 0  # ModernBERT's first layer
        self.attention_norm = nn.Identity() if skip else make_norm(config)
        self.mlp = ParallelMLP(
            h,
            config.intermediate_size,
            ctx.tp,
            activation=config.mlp.activation,
            sequence_parallel=sp,
            gated=config.mlp.gated,
            bias=config.bias,
        )
        self.mlp_dropout = ParallelDropout(
            config.dropout, ctx.rng, sequence=sequence, context=ctx.cp
        )
        self.mlp_norm = make_norm(config)
        if sp:
            mark_sequence_parallel(self.attention_norm, self.mlp_norm)

    def selective_recompute_targets(self) -> list[tuple[nn.Module, str]]:
        """(module, method) pairs that selective recomputation wraps: the attention core, which
        holds the b x heads x s x s tensors and costs two batched matmuls to redo."""
        return [(self.attention.core, "forward")]

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """`cache`: decoding; x holds the new positions only (see the attention's, as for
        `positions`)."""
        if self.pre_norm:
            attended = self.attention(self.attention_norm(x), mask, cache, positions)
            x = x + self.attention_dropout(attended)
            return x + self.mlp_dropout(self.mlp(self.mlp_norm(x)))
        attended = self.attention(x, mask, cache, positions)
        x = self.attention_norm(x + self.attention_dropout(attended))
        return self.mlp_norm(x + self.mlp_dropout(self.mlp(x)))


class TransformerStack(nn.Module):
    """num_layers TransformerLayers applied in order; `layers` is what recomputation wraps."""

    def __init__(self, config: ModelConfig, ctx: ParallelContext, *, causal: bool) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            TransformerLayer(config, ctx, causal=causal, index=i) for i in range(config.num_layers)
        )

    def forward(
        self, x: Tensor, mask: Tensor | None = None, positions: Tensor | None = None
    ) -> Tensor:
        """`positions` [b, s]: packed documents' (rotary embeddings restart per document)."""
        for layer in self.layers:
            x = layer(x, mask, None, positions)
        return x
