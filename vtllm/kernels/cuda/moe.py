"""Mixture-of-experts on the GPU: the router's top-k, the routed experts' linears and the
combine, all on the device (the routing never reaches the host, so a step with experts is
captured into a CUDA graph like any other). Hot path: keep it lean.

bf16 experts whose gate/up and down sides are multiples of 16 (the HF safetensors case) go to
the tensor cores: each expert packed in _linear_mma's fragment order, stacked (_moe_mma), with
the x rounding the dense linears get (x_bf16), pairs grouped in tiles of eight. Every other
layer's experts (GGUF blocks, float32, odd shapes) take the GEMV: uploaded as one matrix per
part, expert e's rows at e * N .. of a [E * N, cols] array in their stored type, so one kernel
serves every expert, its rows picked by the device-side ids (_moe_gemv). A gate/up pair of
one storage type is one part [E * 2I, cols] (gate rows then up rows per expert); of two
types, two parts, each writing its columns of the one [pairs, 2I] output. Per step: the
top-k, the (token, rank) pairs grouped by expert (`group_pairs`, so that a block reads an
expert's rows once for up to four of its pairs, eight on the tensor cores), then per pair
gate/up, silu(gate) * up, down, and the combine adds each token's k rows, weighted, in rank
order (_moe_route). Every step size takes a layer's one path and a pair's bits do not
depend on the pairs beside it, so a token's bits never depend on its step.

Semantics are kernels/cpu/moe's: float64 softmax rounded to float32, top-k by strict > over
ascending experts (ties to the lower index), renormalized weights divided by their float32
sum in rank order, the combine's first product then one fma per rank.
"""

from dataclasses import dataclass

import numpy as np
from numba import cuda

from vtllm.kernels import QType
from vtllm.kernels.cuda._host import aligned, check, weight_view
from vtllm.kernels.cuda._linear_kquant import TYPES as KQUANT_TYPES
from vtllm.kernels.cuda._linear_mma import packable
from vtllm.kernels.cuda._moe_gemv import KERNELS, experts_gemv
from vtllm.kernels.cuda._moe_mma import PAIRS_PER_TILE as MMA_PAIRS
from vtllm.kernels.cuda._moe_mma import PackedExperts, experts_mma, pack_experts
from vtllm.kernels.cuda._moe_route import PAIRS_PER_TILE as GEMV_PAIRS
from vtllm.kernels.cuda._moe_route import combine as _combine
from vtllm.kernels.cuda._moe_route import group as _group
from vtllm.kernels.cuda._moe_route import route as _route
from vtllm.kernels.cuda.activation import silu_and_mul

__all__ = [
    "DeviceExperts",
    "PairGroups",
    "combine",
    "expert_linear",
    "group_pairs",
    "route_top_k",
    "upload_experts",
]

_QUANT = (int(QType.Q4_0), int(QType.Q4_1), int(QType.Q8_0))


@dataclass(slots=True)
class PairGroups:
    """A step's (token, rank) pairs grouped by expert on the device (group_pairs), as
    expert_linear reads them: static buffers, sized once for the largest step."""

    order: object  # [max pairs] int32: pairs sorted by expert
    expert_start: object  # [E + 1] int32: where each expert's pairs start in order
    tile_start: object  # [E + 1] int32: where each expert's tiles of pairs start
    fill: object  # [E] int32: the grouping's counters
    per_tile: int = GEMV_PAIRS  # pairs a tile, as group_pairs last grouped them

    @classmethod
    def create(cls, max_pairs: int, num_experts: int, *, stream=0) -> "PairGroups":
        def buf(n):
            return cuda.device_array(n, np.int32, stream=stream)

        return cls(buf(max_pairs), buf(num_experts + 1), buf(num_experts + 1), buf(num_experts))

    @property
    def num_experts(self) -> int:
        return self.fill.shape[0]


@dataclass(slots=True)
class ExpertPart:
    data: object  # device array [E * rows, cols or row bytes] in the stored type, or packed
    qtype: int
    rows: int  # output rows of one expert
    col0: int  # where this part's outputs start in the output row


@dataclass(slots=True)
class DeviceExperts:
    """A layer's experts on the device: gate/up (one part, or gate and up of two types) and
    down, stacked over the experts (the module docstring)."""

    num_experts: int
    gate_up: list[ExpertPart]
    down: ExpertPart
    width: int  # I, the experts' intermediate size

    @property
    def pairs_per_tile(self) -> int:
        """The tile size group_pairs must group this layer's pairs in."""
        return MMA_PAIRS if isinstance(self.down.data, PackedExperts) else GEMV_PAIRS

    def gated_up(self, x, ids, groups: PairGroups, gate_up, act, *, stream=0) -> None:
        """act [pairs, I] = silu(gate) * up of each pair's token row of x [T, hidden]; gate_up
        [pairs, 2I] is scratch; groups: ids grouped by group_pairs."""
        for part in self.gate_up:
            expert_linear(x, ids, groups, part.data, part.qtype, gate_up, col0=part.col0,
                          stream=stream)  # fmt: skip
        silu_and_mul(gate_up, act, stream=stream)

    def down_proj(self, act, ids, groups: PairGroups, ys, *, stream=0) -> None:
        """ys [pairs, hidden] = each pair's row of act through its expert's down matrix."""
        d = self.down
        expert_linear(act, ids, groups, d.data, d.qtype, ys, stream=stream)


def _stack(mats: list, stream) -> tuple[object, int, int]:
    """[(data, qtype, (rows, cols))] of every expert, one storage type: (device [E * rows,
    ...], qtype, rows)."""
    types = {int(q) for _, q, _ in mats}
    shapes = {tuple(s) for _, _, s in mats}
    if len(types) != 1 or len(shapes) != 1:
        raise ValueError("moe: a layer's experts must share one storage type and shape per part")
    host = np.concatenate([np.ascontiguousarray(d) for d, _, _ in mats], axis=0)
    return cuda.to_device(host, stream=stream), types.pop(), shapes.pop()[0]


def upload_experts(
    gate_up: list[list], down: list, *, x_bf16: bool = False, stream
) -> DeviceExperts:
    """Per expert, gate_up: [(data, qtype, shape)] of one fused [2I, hidden] matrix or gate and
    up; down: (data, qtype, shape) [hidden, I]. Gate and up of one type are stacked as one
    part; ValueError where the experts' types or shapes differ. bf16 experts with 16-aligned
    sides are packed for the tensor cores, x_bf16 as _linear_mma.PackedBF16 takes it."""
    if not gate_up or len(gate_up) != len(down):
        raise ValueError("moe: gate_up and down need one entry per expert")
    parts = []
    if len({len(g) for g in gate_up}) != 1:
        raise ValueError("moe: every expert's gate/up must be split the same way")
    if len(gate_up[0]) == 2 and gate_up[0][0][1] == gate_up[0][1][1]:  # gate, up: one type
        gate_up = [[_concat_rows(g)] for g in gate_up]
    if _packs([g[0] for g in gate_up]) and _packs(down) and len(gate_up[0]) == 1:
        gu = pack_experts([d for ((d, _, _),) in gate_up], x_bf16=x_bf16, stream=stream)
        dn = pack_experts([d for d, _, _ in down], x_bf16=x_bf16, stream=stream)
        gu_part, dn_part = ExpertPart(gu, QType.BF16, gu.n, 0), ExpertPart(dn, QType.BF16, dn.n, 0)
        return DeviceExperts(len(down), [gu_part], dn_part, gu.n // 2)
    col = 0
    for i in range(len(gate_up[0])):
        data, qtype, rows = _stack([g[i] for g in gate_up], stream)
        parts.append(ExpertPart(data, qtype, rows, col))
        col += rows
    data, qtype, rows = _stack(down, stream)
    return DeviceExperts(len(down), parts, ExpertPart(data, qtype, rows, 0), col // 2)


def _packs(mats: list) -> bool:
    """Whether every expert's matrix (data, qtype, shape) is bf16 of one 16-aligned shape."""
    shapes = {tuple(s) for _, _, s in mats}
    return (
        all(int(q) == QType.BF16 for _, q, _ in mats)
        and len(shapes) == 1
        and packable(*shapes.pop())
    )


def _concat_rows(mats: list) -> tuple:
    data = np.concatenate([np.ascontiguousarray(d) for d, _, _ in mats], axis=0)
    rows = sum(s[0] for _, _, s in mats)
    return data, mats[0][1], (rows, mats[0][2][1])


def route_top_k(logits, renormalize: bool, ids, weights, *, stream=0) -> None:
    """Per token (row of logits float32 [T, E]): softmax, then the top k (k = ids.shape[1])
    by probability, descending, ties to the lower expert; ids int32 [T, k] gets the experts in
    rank order, weights float32 [T, k] their probabilities, divided by their sum when
    renormalize. logits is scratch: it is overwritten."""
    check("route_top_k", "logits", logits, np.float32, 2)
    t, e = logits.shape
    check("route_top_k", "ids", ids, np.int32, 2)
    k = ids.shape[1]
    if not 1 <= k <= e or ids.shape[0] != t:
        raise ValueError(f"route_top_k: ids {tuple(ids.shape)} for {e} experts, {t} tokens")
    check("route_top_k", "weights", weights, np.float32, 2, (t, k))
    if t:
        _route(logits, bool(renormalize), ids, weights, stream)


def group_pairs(ids, groups: PairGroups, *, per_tile: int = GEMV_PAIRS, stream=0) -> None:
    """Groups the pairs p = t * k + r of ids int32 [T, k] by expert into groups (sized for at
    least T * k pairs and the layer's experts) in tiles of per_tile pairs (the layer's
    DeviceExperts.pairs_per_tile): what expert_linear reads."""
    check("group_pairs", "ids", ids, np.int32, 2)
    if ids.shape[0] * ids.shape[1] > groups.order.shape[0]:
        raise ValueError(f"group_pairs: {tuple(ids.shape)} is more pairs than groups holds")
    if per_tile not in (GEMV_PAIRS, MMA_PAIRS):
        raise ValueError(f"group_pairs: tiles of {per_tile} pairs fit no expert kernel")
    groups.per_tile = per_tile
    if ids.shape[0]:
        _group(ids, groups.num_experts, per_tile, groups.fill, groups.expert_start,
               groups.tile_start, groups.order, stream)  # fmt: skip


def expert_linear(x, ids, groups: PairGroups, w, qtype, out, *, col0: int = 0, stream=0):
    """out[p, col0:col0 + N] = x[row] @ W_e.T for each pair p = t * k + r, e = ids[t, r], W
    = (w, qtype) the experts stacked [E * N, K] (upload_experts), or a PackedExperts (the
    tensor cores; qtype BF16), groups what group_pairs made of ids (in tiles of that kernel's
    size); row is t where x is [T, K], p where x is [T * k, K]. Device arrays; out [T * k,
    >= col0 + N] float32."""
    check("expert_linear", "ids", ids, np.int32, 2)
    t, k = ids.shape
    num_experts = groups.num_experts
    check("expert_linear", "x", x, np.float32, 2)
    if x.shape[0] not in (t, t * k):
        raise ValueError(f"expert_linear: x {tuple(x.shape)} for ids {tuple(ids.shape)}")
    if isinstance(w, PackedExperts):
        _linear_mma_experts(x, ids, groups, w, out, col0, stream)
        return
    if groups.per_tile != GEMV_PAIRS:
        raise ValueError(f"expert_linear: the GEMV reads tiles of {GEMV_PAIRS} pairs")
    wv, qt = weight_view("expert_linear", w, qtype, x.shape[1])
    if num_experts < 1 or w.shape[0] % num_experts:
        raise ValueError(f"expert_linear: {w.shape[0]} rows are not {num_experts} experts")
    n = w.shape[0] // num_experts
    check("expert_linear", "out", out, np.float32, 2)
    if out.shape[0] != t * k or out.shape[1] < col0 + n or col0 < 0:
        raise ValueError(f"expert_linear: out {tuple(out.shape)} cannot take [{t * k}, {n}]")
    if t == 0:
        return
    if qt in KQUANT_TYPES:
        kernel = KERNELS["kquant"]
    elif qt in _QUANT:
        kernel = KERNELS["quant"]
    elif x.shape[1] % (2 if qt == QType.F32 else 4) == 0 and aligned(wv, 8):
        kernel, wv = KERNELS["vec"], wv.view(np.uint64)
    else:
        kernel = KERNELS["float"]
    per_token = x.shape[0] == t
    grouped = (groups.order, groups.expert_start, groups.tile_start)
    experts_gemv(kernel, x, ids, grouped, wv, qt, num_experts, per_token, col0, out, stream)


def _linear_mma_experts(x, ids, groups: PairGroups, w: PackedExperts, out, col0, stream):
    t, k = ids.shape
    if w.num_experts != groups.num_experts or x.shape[1] != w.k:
        raise ValueError(f"expert_linear: x {tuple(x.shape)} and {groups.num_experts} experts "
                         f"do not fit {w.num_experts} packed experts [{w.n}, {w.k}]")  # fmt: skip
    if groups.per_tile != MMA_PAIRS:
        raise ValueError(f"expert_linear: the tensor cores read tiles of {MMA_PAIRS} pairs")
    check("expert_linear", "out", out, np.float32, 2)
    if out.shape[0] != t * k or out.shape[1] < col0 + w.n or col0 < 0:
        raise ValueError(f"expert_linear: out {tuple(out.shape)} cannot take [{t * k}, {w.n}]")
    if t:
        grouped = (groups.order, groups.expert_start, groups.tile_start)
        experts_mma(x, ids, grouped, w, col0, out, stream)


def combine(ys, weights, out, *, accumulate: bool = False, stream=0) -> None:
    """out[t] (+)= sum over r in rank order of weights[t, r] * ys[t * k + r]: ys float32
    [T * k, hidden] the experts' outputs in pair order, weights float32 [T, k]; accumulate
    adds the sum into out (the residual stream) instead of writing it."""
    check("combine", "out", out, np.float32, 2)
    check("combine", "weights", weights, np.float32, 2)
    t, k = weights.shape
    if out.shape[0] != t or k < 1:
        raise ValueError(f"combine: weights {tuple(weights.shape)} for out {tuple(out.shape)}")
    check("combine", "ys", ys, np.float32, 2, (t * k, out.shape[1]))
    if t and out.shape[1]:
        _combine(ys, weights, bool(accumulate), out, stream)
