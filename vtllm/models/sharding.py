"""Tensor-parallel sharding of Llama-family weights: the full ModelWeights and a rank -> the
rank's shard (docs/tensor_parallel.md has the split of each matrix and why).

- qkv, gate_up: column-parallel (each rank keeps the output rows of its heads / its slice of
  the intermediate); every output element is still one full-K dot product, so its bits are
  TP=1's.
- o, down: row-parallel (each rank keeps the input columns matching its heads / slice); the
  ranks' partial products are summed by an all-reduce (models/ops: add_linear).
- embedding and lm_head: vocab-parallel (rows [rank * s, (rank + 1) * s), s = ceil(V / N),
  the last shard padded with zero rows so that every rank's logits have one width).
- heads: whole GQA groups per rank (KV heads split as evenly as the ranks allow, so 9 q / 3 kv
  heads split 6 + 3 over two ranks); with fewer KV heads than ranks each KV head is replicated
  on N / kv ranks, which split its group's q heads.

Splits may be uneven; a quantized matrix splits along K only at its block boundaries.
Gemma, MoE and Phi-3 are refused (their extra ops have no sharded form yet).
"""

import dataclasses
from dataclasses import dataclass

import msgspec
import numpy as np

from vtllm.errors import UnsupportedModel
from vtllm.kernels import block_layout
from vtllm.models.config import ModelConfig
from vtllm.models.registry import lookup
from vtllm.models.weights import LayerWeights, ModelWeights, Weight


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """What one rank holds, in heads, intermediate columns and vocab rows."""

    rank: int
    world_size: int
    q_heads: range
    kv_heads: range
    intermediate: range
    vocab_start: int
    vocab_rows: int  # real rows of the rank's vocab shard ...
    vocab_padded: int  # ... and its width with padding: ceil(V / N), one for every rank


@dataclass(frozen=True, slots=True)
class Shard:
    plan: ShardPlan
    config: ModelConfig  # the rank's view: its heads, intermediate and vocab-shard width
    weights: ModelWeights


def even_ranges(total: int, parts: int, unit: int = 1) -> list[range]:
    """[0, total) in `parts` contiguous ranges of whole units, the first ones longer by a unit
    where it does not divide evenly."""
    units = total // unit
    base, extra = divmod(units, parts)
    out, start = [], 0
    for p in range(parts):
        n = (base + (p < extra)) * unit
        out.append(range(start, start + n))
        start += n
    return out


def _k_unit(weight: Weight) -> int:
    layout = block_layout(weight.qtype)
    return 1 if layout is None else layout[0]


def check_shardable(config: ModelConfig, world_size: int) -> None:
    """UnsupportedModel (one line) unless the model can run split over world_size ranks."""
    fam = lookup(config.architecture)
    if fam.forward != "llama" or config.num_experts or config.architecture == "phi3":
        raise UnsupportedModel(
            f"tensor parallelism: architecture {config.architecture!r} is not supported "
            "(llama, mistral, qwen2 and qwen3 are)"
        )
    if config.num_kv_heads < world_size:
        if world_size % config.num_kv_heads:
            raise UnsupportedModel(
                f"tensor parallelism: {config.num_kv_heads} KV heads cannot be replicated "
                f"evenly over {world_size} ranks"
            )
        group = config.num_heads // config.num_kv_heads
        if group < world_size // config.num_kv_heads:
            raise UnsupportedModel(
                f"tensor parallelism: {config.num_heads} q heads are fewer than {world_size} ranks"
            )
    if config.intermediate_size < world_size or config.vocab_size < world_size:
        raise UnsupportedModel(f"tensor parallelism: the model is too small for {world_size} ranks")


def shard_plan(config: ModelConfig, rank: int, world_size: int) -> ShardPlan:
    check_shardable(config, world_size)
    group = config.num_heads // config.num_kv_heads
    if config.num_kv_heads >= world_size:
        kv = even_ranges(config.num_kv_heads, world_size)[rank]
        q = range(kv.start * group, kv.stop * group)
    else:
        copies = world_size // config.num_kv_heads
        head = rank // copies
        kv = range(head, head + 1)
        part = even_ranges(group, copies)[rank % copies]
        q = range(head * group + part.start, head * group + part.stop)
    padded = -(-config.vocab_size // world_size)
    start = rank * padded
    rows = max(0, min(padded, config.vocab_size - start))
    inter = range(0, config.intermediate_size)  # shard_weights cuts it in down's K blocks
    return ShardPlan(rank, world_size, q, kv, inter, start, rows, padded)


def _rows(weight: Weight, index: np.ndarray) -> Weight:
    return Weight(
        np.ascontiguousarray(weight.data[index]), weight.qtype, (len(index), weight.shape[1])
    )


def _check_cols(weight: Weight, cols: range, what: str) -> None:
    unit = _k_unit(weight)
    if cols.start % unit or cols.stop % unit:
        raise UnsupportedModel(
            f"tensor parallelism: {what} splits inside a {unit}-weight block of its storage type"
        )


def _cols(weight: Weight, cols: range, what: str) -> Weight:
    _check_cols(weight, cols, what)
    unit = _k_unit(weight)
    layout = block_layout(weight.qtype)
    per = 1 if layout is None else layout[1]
    lo, hi = cols.start // unit * per, cols.stop // unit * per
    data = np.ascontiguousarray(weight.data[:, lo:hi])
    return Weight(data, weight.qtype, (weight.shape[0], len(cols)))


def _vocab_rows(weight: Weight, plan: ShardPlan) -> Weight:
    data = weight.data[plan.vocab_start : plan.vocab_start + plan.vocab_rows]
    pad = plan.vocab_padded - plan.vocab_rows
    if pad:  # zero bytes decode to zero weights in every storage type
        data = np.concatenate([data, np.zeros((pad, data.shape[1]), data.dtype)])
    return Weight(np.array(data, order="C"), weight.qtype, (plan.vocab_padded, weight.shape[1]))


def _qkv_index(config: ModelConfig, plan: ShardPlan) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    dim = config.head_dim
    q = np.arange(plan.q_heads.start * dim, plan.q_heads.stop * dim)
    kv = np.arange(plan.kv_heads.start * dim, plan.kv_heads.stop * dim)
    return q, kv, kv


def _shard_layer(config: ModelConfig, plan: ShardPlan, layer: LayerWeights, inter: range):
    q, k, v = _qkv_index(config, plan)
    fused = np.concatenate([q, config.q_size + k, config.q_size + config.kv_size + v])
    if len(layer.qkv) == 1:
        qkv = [_rows(layer.qkv[0], fused)]
    else:  # q, k and v stored apart (their types differ)
        qkv = [_rows(w, idx) for w, idx in zip(layer.qkv, (q, k, v), strict=True)]
    bias = None if layer.qkv_bias is None else np.ascontiguousarray(layer.qkv_bias[fused])
    cols = np.arange(inter.start, inter.stop)
    if len(layer.gate_up) == 1:
        gate_up = [_rows(layer.gate_up[0], np.concatenate([cols, config.intermediate_size + cols]))]
    else:
        gate_up = [_rows(w, cols) for w in layer.gate_up]
    dim = config.head_dim
    o = _cols(layer.o, range(plan.q_heads.start * dim, plan.q_heads.stop * dim), "o_proj")
    return LayerWeights(
        attn_norm=layer.attn_norm,
        qkv=qkv,
        o=o,
        ffn_norm=layer.ffn_norm,
        gate_up=gate_up,
        down=_cols(layer.down, inter, "down_proj"),
        qkv_bias=bias,
        q_norm=layer.q_norm,
        k_norm=layer.k_norm,
    )


def check_weights(config: ModelConfig, weights: ModelWeights, world_size: int) -> None:
    """UnsupportedModel (one line) unless every rank's shard of these weights can be cut (the
    K splits of o and down fall on block boundaries), without copying anything."""
    check_shardable(config, world_size)
    _intermediate(config, weights, 0, world_size)
    dim = config.head_dim
    for rank in range(world_size):
        q = shard_plan(config, rank, world_size).q_heads
        for layer in weights.layers[:1]:  # one storage type per matrix role across layers
            _check_cols(layer.o, range(q.start * dim, q.stop * dim), "o_proj")


def _intermediate(config: ModelConfig, weights: ModelWeights, rank: int, world_size: int):
    """The rank's intermediate columns, in units of down's K blocks (one type in every layer)."""
    unit = max(_k_unit(layer.down) for layer in weights.layers)
    parts = even_ranges(config.intermediate_size, world_size, unit)
    if parts[-1].stop != config.intermediate_size or not parts[-1]:
        raise UnsupportedModel(
            f"tensor parallelism: intermediate size {config.intermediate_size} does not split "
            f"into {world_size} parts of whole {unit}-weight blocks"
        )
    return parts[rank]


def shard_weights(config: ModelConfig, weights: ModelWeights, rank: int, world_size: int) -> Shard:
    """The rank's shard of a Llama-family model (the module docstring)."""
    plan = shard_plan(config, rank, world_size)
    inter = _intermediate(config, weights, rank, world_size)
    plan = dataclasses.replace(plan, intermediate=inter)
    embed = _vocab_rows(weights.embed, plan)
    lm_head = embed if weights.lm_head is weights.embed else _vocab_rows(weights.lm_head, plan)
    layers = [_shard_layer(config, plan, layer, inter) for layer in weights.layers]
    shard_config = msgspec.structs.replace(
        config,
        num_heads=len(plan.q_heads),
        num_kv_heads=len(plan.kv_heads),
        intermediate_size=len(inter),
        vocab_size=plan.vocab_padded,
    )
    shard = ModelWeights(embed, layers, weights.final_norm, lm_head, weights.rope_freq_factors)
    return Shard(plan, shard_config, shard)
