"""Weights as the kernels take them: each matrix is (data, qtype), kept as stored."""

from dataclasses import dataclass

import numpy as np

from vtllm.kernels import QType, block_layout


@dataclass(slots=True)
class Weight:
    data: np.ndarray  # layout per QType, see vtllm.kernels
    qtype: QType
    shape: tuple[int, int]  # logical [rows, cols] = [out_features, in_features]

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


def weight_from_array(data: np.ndarray, qtype: QType, shape: tuple[int, int]) -> Weight:
    rows, cols = shape
    layout = block_layout(qtype)
    if layout is not None:
        expected = (rows, cols // layout[0] * layout[1])
    else:
        expected = (rows, cols)
    if tuple(data.shape) != expected:
        data = data.reshape(expected)
    return Weight(data, qtype, (rows, cols))


def concat_rows(weights: list[Weight]) -> Weight:
    """Stack matrices along the output dimension (fused QKV, fused gate/up)."""
    if len({w.qtype for w in weights}) != 1 or len({w.shape[1] for w in weights}) != 1:
        raise ValueError("only matrices of one storage type and width can be stacked")
    data = np.ascontiguousarray(np.concatenate([w.data for w in weights], axis=0))
    return Weight(data, weights[0].qtype, (sum(w.shape[0] for w in weights), weights[0].shape[1]))


def stacked_view(weights: list[Weight]) -> Weight | None:
    """concat_rows without a copy where the matrices lie back to back in one buffer (GGUF
    files store gate and up one after the other): a view of that buffer, or None."""
    first = weights[0]
    if len({w.qtype for w in weights}) != 1 or len({w.shape[1] for w in weights}) != 1:
        return None
    if any(w.data.dtype != first.data.dtype or not w.data.flags.c_contiguous for w in weights):
        return None
    root = _root(first.data)
    if not root.flags.c_contiguous or any(_root(w.data) is not root for w in weights):
        return None
    start = first.data.ctypes.data - root.ctypes.data
    end = start
    for w in weights:
        if w.data.ctypes.data - root.ctypes.data != end:
            return None
        end += w.data.nbytes
    data = root.reshape(-1).view(np.uint8)[start:end].view(first.data.dtype)
    rows = sum(w.data.shape[0] for w in weights)
    data = data.reshape(rows, *first.data.shape[1:])
    return Weight(data, first.qtype, (sum(w.shape[0] for w in weights), first.shape[1]))


def _root(a: np.ndarray) -> np.ndarray:
    """The array that owns the buffer a views (a itself when it owns its data)."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


@dataclass(slots=True)
class MoeWeights:
    """A layer's routed experts (models/moe)."""

    router: Weight  # [num_experts, hidden]
    gate_up: list[list[Weight]]  # per expert: one fused [2 * moe_intermediate, hidden], or gate, up
    down: list[Weight]  # per expert: [hidden, moe_intermediate]

    def matrices(self) -> list[Weight]:
        return [self.router, *(w for pair in self.gate_up for w in pair), *self.down]


@dataclass(slots=True)
class LayerWeights:
    attn_norm: np.ndarray  # float32 [hidden]
    qkv: list[Weight]  # one fused [q_size + 2 * kv_size, hidden], or q, k, v when types differ
    o: Weight  # [hidden, q_size]
    ffn_norm: np.ndarray
    gate_up: list[Weight]  # one fused [2 * intermediate, hidden], or gate, up; [] with moe
    down: Weight | None  # [hidden, intermediate]; None with moe
    qkv_bias: np.ndarray | None = None  # float32 [q_size + 2 * kv_size]
    q_norm: np.ndarray | None = None  # float32 [head_dim]
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None  # Gemma: on the attention's output, before the add
    post_ffn_norm: np.ndarray | None = None  # Gemma: on the MLP's output, before the add
    moe: MoeWeights | None = None  # routed experts in place of the dense MLP (gate_up, down)


@dataclass(slots=True)
class ModelWeights:
    embed: Weight  # [vocab, hidden]
    layers: list[LayerWeights]
    final_norm: np.ndarray
    lm_head: Weight  # the embedding itself when tied
    rope_freq_factors: np.ndarray | None = None  # GGUF llama3 files store scaling this way

    @property
    def nbytes(self) -> int:
        total = self.embed.nbytes + self.final_norm.nbytes
        if self.lm_head is not self.embed:
            total += self.lm_head.nbytes
        for layer in self.layers:
            for w in (*layer.qkv, layer.o, *layer.gate_up):
                total += w.nbytes
            if layer.down is not None:
                total += layer.down.nbytes
            if layer.moe is not None:
                total += sum(w.nbytes for w in layer.moe.matrices())
        return total
