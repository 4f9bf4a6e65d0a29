"""FP8 checkpoints loaded for the CUDA device (load_model(fp8_rows=True)): matrices with
per-tensor or per-channel scales stay e4m3 codes with a float32 scale per row (FP8_ROWS), whose
values are the CPU's float32 dequantization row by row; block-scaled ones and the embedding stay
float32. No GPU needed: this is the host side of the upload."""

import logging

import numpy as np
import pytest

from tests.models.test_fp8_checkpoints import (
    BLOCK,
    HF_FP8,
    compressed,
    quantize_checkpoint,
    write_dir,
)
from vtllm.kernels import FP8_ROWS, QType
from vtllm.models import fp8
from vtllm.models.loader import load_model


def row_values(weight) -> np.ndarray:
    """float32 values of FP8_ROWS: each row's codes times the scale stored after them."""
    rows, cols = weight.shape
    codes, scale = weight.data[:, :cols], weight.data[:, cols:].copy().view("<f4")
    return fp8.E4M3[codes] * scale.reshape(rows, 1)


def strategy_of(name):
    return "channel" if "self_attn" in name else "tensor"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    quant, plain = quantize_checkpoint("mistral", strategy_of, "_scale", bf16_scales=True)
    directory = tmp_path_factory.mktemp("fp8") / "mistral"
    return write_dir(directory, "mistral", quant, compressed("channel", "tensor")), plain


def test_cuda_load_keeps_codes_and_row_scales(checkpoint):
    directory, plain = checkpoint
    weights = load_model(directory, fp8_rows=True).weights
    for i, layer in enumerate(weights.layers):
        p = f"model.layers.{i}."
        named = {
            **{f"self_attn.{n}_proj": w for n, w in zip("qkv", layer.qkv, strict=True)},
            "self_attn.o_proj": layer.o,
            "mlp.gate_proj": layer.gate_up[0],
            "mlp.up_proj": layer.gate_up[1],
            "mlp.down_proj": layer.down,
        }
        for name, weight in named.items():
            want = plain[p + name + ".weight"]
            assert weight.qtype == FP8_ROWS and weight.shape == want.shape
            assert weight.data.dtype == np.uint8 and weight.data.shape[1] == want.shape[1] + 4
            assert np.array_equal(row_values(weight).view(np.uint32), want.view(np.uint32))
    assert weights.embed.qtype == QType.F32  # the embedding was never FP8 here: as stored


def test_cpu_load_is_unchanged(checkpoint):
    directory, plain = checkpoint
    layer = load_model(directory).weights.layers[0]
    assert layer.o.qtype == QType.F32
    assert np.array_equal(layer.o.data, plain["model.layers.0.self_attn.o_proj.weight"])


def test_block_scales_stay_float32_with_a_log_line(tmp_path, caplog):
    quant, plain = quantize_checkpoint("phi3", lambda _: tuple(BLOCK), "_scale_inv")
    directory = write_dir(tmp_path / "fp8", "phi3", quant, HF_FP8)
    with caplog.at_level(logging.INFO, logger="vtllm.models.fp8"):
        layer = load_model(directory, fp8_rows=True).weights.layers[0]
    assert any("block-scaled" in r.getMessage() for r in caplog.records)
    assert layer.down.qtype == QType.F32
    assert np.array_equal(layer.down.data, plain["model.layers.0.mlp.down_proj.weight"])
