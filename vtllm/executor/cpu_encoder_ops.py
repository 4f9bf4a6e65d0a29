"""The CPU backend's encoder ops (models/bert.EncoderOps): numba njit kernels on host arrays.

An encoder runs whole sequences once, with no cache and no graph, so each op allocates its
output: the arena the decoder ops keep for CUDA graphs buys nothing here.
"""

import numpy as np

from vtllm.kernels.cpu import encoder, linear
from vtllm.models.bert import EncoderWeights
from vtllm.models.weights import Weight


class CpuEncoderOps:
    def embeddings(self, w: EncoderWeights, ids, positions, eps: float):
        x = w.word[ids] + w.position[positions] + w.token_type[0]
        out = np.empty_like(x)
        encoder.layer_norm(np.ascontiguousarray(x, np.float32), *w.embed_norm, eps, out)
        return out

    def linear(self, x, weight: Weight, bias):
        out = np.empty((x.shape[0], weight.shape[0]), np.float32)
        linear(x, weight.data, weight.qtype, out, bias=bias)
        return out

    def attention(self, qkv, starts, num_heads: int, head_dim: int):
        out = np.empty((qkv.shape[0], num_heads * head_dim), np.float32)
        encoder.encoder_attention(qkv, starts, num_heads, head_dim, out)
        return out

    def add_norm(self, x, residual, norm, eps: float):
        out = np.empty_like(x)
        encoder.layer_norm(x, *norm, eps, out, residual=residual)
        return out

    def gelu(self, x):
        encoder.gelu(x)
        return x
