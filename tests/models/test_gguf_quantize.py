"""The K-quant encoders of gguf_quantize decode (by gguf-py) close to their input, and a
requantized file keeps its metadata and loads with llama.cpp's mix of types."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as G
from gguf.quants import dequantize

from tests.models.test_gguf_kquants import write_mix
from vtllm.kernels import QType
from vtllm.models.gguf_quantize import encode, requantize
from vtllm.models.loader import load_model

# rms error / rms of the weights on Gaussian rows, with a margin (6-bit: ~0.02, 5: ~0.04, 4: ~0.08)
RMS = {G.Q4_K: 0.1, G.Q5_K: 0.05, G.Q6_K: 0.03}


@pytest.mark.parametrize("qtype", list(RMS), ids=lambda q: q.name)
def test_encoders_round_trip(qtype):
    rng = np.random.default_rng(int(qtype))
    w = (rng.standard_normal((32, 768)) * rng.uniform(0.01, 2, (32, 1))).astype(np.float32)
    w[0, :256] = 0.0  # an all-zero super-block
    w[1, :32] = 5.0  # a constant, positive sub-block
    blocks, used = encode(w, qtype)
    assert used == qtype
    back = dequantize(blocks, qtype).reshape(w.shape)
    assert np.all(np.isfinite(back)) and np.all(back[0, :256] == 0)
    err = back - w
    assert np.sqrt(np.mean(err**2) / np.mean(w**2)) < RMS[qtype]
    # no element further off than a step of its sub-block's own range (with the scale's rounding)
    span = np.abs(w).reshape(32, -1, 16).max(axis=2, keepdims=True)
    assert np.all(np.abs(err).reshape(32, -1, 16) <= span * 0.25 + 1e-6)


def test_rows_no_multiple_of_256_fall_back():
    w = np.ones((4, 576), np.float32)
    assert encode(w, G.Q4_K)[1] == G.Q5_0
    assert encode(w, G.Q5_K)[1] == G.Q5_1
    assert encode(w, G.Q6_K)[1] == G.Q8_0


def test_requantized_file_loads_with_the_mix(tmp_path):
    _, f32_path, _ = write_mix(tmp_path, "Q4_K_M")
    out = tmp_path / "requant.gguf"
    types = requantize(f32_path, out, "Q4_K_M")
    loaded = load_model(out)
    w = loaded.weights
    assert types["blk.0.attn_q.weight"] == "Q4_K" and w.layers[0].o.qtype == QType.Q4_K
    # llama.cpp's use_more_bits over 2 layers: the last (i >= 7 n / 8), not the first
    assert types["blk.1.ffn_down.weight"] == "Q6_K" and types["blk.0.ffn_down.weight"] == "Q4_K"
    assert w.embed.qtype == QType.Q6_K  # tied: the output's type
    assert types["blk.0.attn_norm.weight"] == "F32"
    assert loaded.config == load_model(f32_path).config
