"""The CUDA kernel table (numba.cuda): what executor/cuda_ops calls on a GPU.

One public module per op family, each owning the choice between its kernels: attention (decode,
prefill, fused rope paths), matmul (which GEMM / GEMV for which step size, weights on the
device), norm, rope, activation, embedding, gather, kv_cache, sampling, logprobs. Modules with
a leading underscore are implementation (kernels, and the device helpers they share: _device,
_ptx*, _host, _kv_cache); only the family modules import them, and callers outside this package
import the family modules and this table only.

Same launchers as kernels.cpu, on device arrays, each with `stream` keyword-only. Importing this
package needs no GPU (kernels compile at their first launch); with NUMBA_ENABLE_CUDASIM=1 set
before numba.cuda is first imported, everything runs under numba's simulator.
Also what the executor asks of the device's kernels: KV_DTYPES (the KV cache's storage types),
GRID_DEPENDENCY (kernels open with the programmatic-launch wait, sm_90) and WGMMA (Hopper's
warpgroup GEMM is available).
"""

import numpy as np
from numba import cuda

from vtllm.kernels.cuda._device import SIMULATOR
from vtllm.kernels.cuda._ptx import GRID_DEPENDENCY
from vtllm.kernels.cuda.activation import silu_and_mul
from vtllm.kernels.cuda.attention import paged_attention
from vtllm.kernels.cuda.embedding import embedding
from vtllm.kernels.cuda.kv_cache import KV_DTYPES, write_kv
from vtllm.kernels.cuda.logprobs import LogprobsOut, prompt_logprobs
from vtllm.kernels.cuda.matmul import WGMMA, linear
from vtllm.kernels.cuda.norm import rms_norm
from vtllm.kernels.cuda.rope import rope_cos_sin, rotary
from vtllm.kernels.cuda.sampling import SamplerScratch, apply_token_masks, device_table, sample


def empty(shape, dtype=np.float32, *, stream=0):
    """An uninitialized device array (the table's counterpart of np.empty)."""
    return cuda.device_array(shape, dtype, stream=stream)


__all__ = [
    "GRID_DEPENDENCY",
    "KV_DTYPES",
    "SIMULATOR",
    "WGMMA",
    "LogprobsOut",
    "SamplerScratch",
    "apply_token_masks",
    "device_table",
    "embedding",
    "empty",
    "linear",
    "paged_attention",
    "prompt_logprobs",
    "rms_norm",
    "rope_cos_sin",
    "rotary",
    "sample",
    "silu_and_mul",
    "write_kv",
]
