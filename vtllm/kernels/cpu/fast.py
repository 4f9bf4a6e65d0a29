"""The CPU kernel table for `fast` numerics: vtllm.kernels.cpu with int8 activations in every
linear over Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 and Q2_K .. Q6_K weights. Float weights (F32 /
F16 / BF16), attention, norms and sampling run the exact float32 kernels. `decoder_layer` runs
a whole layer in one call when its matrices are all of Q4_0 / Q4_1 / Q8_0 (models.llama uses
it when present)."""

from vtllm.kernels.cpu import (
    LogprobsOut,
    SamplingTable,
    embedding,
    empty,
    gelu_tanh_and_mul,
    paged_attention,
    paged_attention_window,
    prompt_logprobs,
    rms_norm,
    rope_cos_sin,
    rotary,
    sample,
    silu_and_mul,
    soft_cap,
    write_kv,
)
from vtllm.kernels.cpu import linear as linear_exact
from vtllm.kernels.cpu.layer_int8 import decoder_layer, layer_weights
from vtllm.kernels.cpu.linear_int8 import KQUANT_INT8, Q5_INT8, QUANTIZED, linear_int8

NUMERICS = "fast"


def linear(x, w, qtype, out, *, bias=None) -> None:
    """As vtllm.kernels.cpu.linear; quantized weights take the int8 kernel."""
    if qtype in QUANTIZED or qtype in KQUANT_INT8 or qtype in Q5_INT8:
        linear_int8(x, w, qtype, out, bias=bias)
    else:
        linear_exact(x, w, qtype, out, bias=bias)


__all__ = [
    "LogprobsOut",
    "SamplingTable",
    "decoder_layer",
    "embedding",
    "empty",
    "gelu_tanh_and_mul",
    "layer_weights",
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
