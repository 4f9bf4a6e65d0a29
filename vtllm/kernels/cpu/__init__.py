"""The CPU kernel table (numba njit): what models.llama calls as `ops`."""

import numpy as np

from vtllm.kernels.cpu.activation import silu_and_mul
from vtllm.kernels.cpu.attention import paged_attention, write_kv
from vtllm.kernels.cpu.attention_window import paged_attention_window
from vtllm.kernels.cpu.embedding import embedding
from vtllm.kernels.cpu.gelu import gelu_tanh_and_mul, soft_cap
from vtllm.kernels.cpu.linear import linear
from vtllm.kernels.cpu.norm import rms_norm
from vtllm.kernels.cpu.rope import rope_cos_sin, rotary
from vtllm.kernels.cpu.sampling import LogprobsOut, SamplingTable, prompt_logprobs, sample

empty = np.empty

__all__ = [
    "LogprobsOut",
    "SamplingTable",
    "embedding",
    "empty",
    "gelu_tanh_and_mul",
    "linear",
    "paged_attention",
    "paged_attention_window",
    "prompt_logprobs",
    "rms_norm",
    "rope_cos_sin",
    "rotary",
    "sample",
    "silu_and_mul",
    "soft_cap",
    "write_kv",
]
