"""FP8 (e4m3fn) checkpoints: tiny ones built here (random valid byte codes written as F8_E4M3
through the safetensors writer, plus their scales), dequantized at load against a decode of our
own, and run through the engine bit for bit as the float32 checkpoint of the same values."""

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import safetensors

from tests.models import phi3_tiny
from tests.models.runner_util import make_runner, teacher_forced_logits
from vtllm.errors import ModelLoadError, UnsupportedModel
from vtllm.models import fp8
from vtllm.models.loader import load_model
from vtllm.models.synthetic import byte_tokenizer_json, save_safetensors, to_bf16_bits

REFS = json.loads((Path(__file__).parents[1] / "goldens/phi3_references.json").read_text())
TABLE = phi3_tiny.e4m3_by_formula()  # the bit formula; its sha256 was checked against torch's
_ST_DTYPES = {
    np.dtype(np.uint8): "float8_e4m3fn",
    np.dtype(np.float32): "float32",
    np.dtype(np.uint16): "bfloat16",
}
BLOCK = [16, 32]  # HF fp8's weight_block_size here: the tiny matrices end in partial blocks
HF_FP8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": BLOCK}


def compressed(*strategies: str, static: bool = False) -> dict:
    groups = {
        f"group_{i}": {
            "targets": ["Linear"],
            "weights": {"type": "float", "num_bits": 8, "strategy": s, "symmetric": True},
            "input_activations": {"type": "float", "num_bits": 8, "dynamic": not static},
        }
        for i, s in enumerate(strategies)
    }
    return {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": groups,
        "ignore": ["lm_head"],
    }


def write_tensors(path: Path, arrays: dict[str, np.ndarray], dtypes: dict | None = None) -> None:
    """safetensors' own writer; uint8 arrays are e4m3 codes, uint16 ones bf16 bits."""
    arrays = {k: np.ascontiguousarray(v) for k, v in arrays.items()}
    specs = {
        name: safetensors.TensorSpec(
            dtype=(dtypes or {}).get(name, _ST_DTYPES[a.dtype]),
            shape=list(a.shape),
            data_ptr=a.ctypes.data,
            data_len=a.nbytes,
        )
        for name, a in arrays.items()
    }
    safetensors.serialize_file(specs, str(path))


def random_codes(rng, shape) -> np.ndarray:
    """Valid e4m3 codes (never the NaN ones, 0x7F and 0xFF)."""
    codes = rng.integers(0, 254, shape, dtype=np.uint8)
    return codes + (codes >= 0x7F).astype(np.uint8)  # skip 0x7F; 0xFF is past the range


def scale_shape(strategy, rows: int, cols: int) -> tuple:
    if strategy == "tensor":
        return (1,)
    if strategy == "channel":
        return (rows, 1)
    return (-(-rows // strategy[0]), -(-cols // strategy[1]))


def decode(codes, scale, strategy) -> np.ndarray:
    """The reference dequantization: the formula's table, each scale over its elements."""
    rows, cols = codes.shape
    scale = scale.astype(np.float32) if scale.dtype != np.uint16 else bf16_values(scale)
    if strategy == "tensor":
        full = np.full((rows, cols), scale.reshape(()), np.float32)
    elif strategy == "channel":
        full = np.broadcast_to(scale.reshape(rows, 1), (rows, cols))
    else:
        r = np.arange(rows) // strategy[0]
        c = np.arange(cols) // strategy[1]
        full = scale[r[:, None], c[None, :]]
    return TABLE[codes] * full


def bf16_values(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def quantize_checkpoint(name: str, strategy_of, suffix: str, *, bf16_scales=False, seed=3):
    """(fp8 tensors, float32 tensors of the same values): the tiny model's matrices (not the
    embedding or head) as random codes and scales; strategy_of(tensor name) -> layout."""
    rng = np.random.default_rng(seed)
    base = phi3_tiny.tensors(name)
    quant, plain = {}, {}
    for tensor, value in base.items():
        if value.ndim != 2 or "embed" in tensor or "lm_head" in tensor:
            quant[tensor] = plain[tensor] = value
            continue
        rows, cols = value.shape
        strategy = strategy_of(tensor)
        codes = random_codes(rng, value.shape)
        # |e4m3| <= 448: scales that bring the weights near N(0, 1/cols)'s size
        scale = rng.uniform(0.5, 2.0, scale_shape(strategy, rows, cols)) / (64 * np.sqrt(cols))
        scale = to_bf16_bits(scale) if bf16_scales else scale.astype(np.float32)
        quant[tensor], quant[tensor + suffix] = codes, scale
        plain[tensor] = decode(codes, scale, strategy)
    return quant, plain


def write_dir(directory: Path, name: str, arrays, quantization=None, dtypes=None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    cfg = dict(phi3_tiny.CONFIGS[name])
    if quantization is not None:
        cfg["quantization_config"] = quantization
        write_tensors(directory / "model.safetensors", arrays, dtypes)
    else:
        save_safetensors(directory / "model.safetensors", arrays)
    (directory / "config.json").write_text(json.dumps(cfg))
    vocab = cfg["vocab_size"]
    (directory / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json(vocab)))
    return directory


def same_logits(fp8_dir: Path, f32_dir: Path) -> None:
    ids = phi3_tiny.prompt("phi3")[:24]
    logits = []
    for directory in (fp8_dir, f32_dir):
        runner = make_runner(load_model(directory), num_blocks=12, max_model_len=32)
        logits.append(teacher_forced_logits(runner, ids, [17, 7]))
    assert np.isfinite(logits[0]).all() and logits[0].std() > 0.1
    assert np.array_equal(logits[0], logits[1])


def test_e4m3_table_is_torchs():
    assert phi3_tiny.e4m3_digest() == REFS["e4m3_table_sha256"]  # confirmed by torch there
    nan = np.isnan(TABLE)
    assert np.flatnonzero(nan).tolist() == [0x7F, 0xFF]
    assert np.array_equal(np.isnan(fp8.E4M3), nan)
    assert np.array_equal(fp8.E4M3[~nan].view(np.uint32), TABLE[~nan].view(np.uint32))
    assert TABLE[0x7E] == 448 and TABLE[0x01] == 2.0**-9 and TABLE[0x80] == 0  # -0


@pytest.mark.parametrize("strategy", ["tensor", "channel", (128, 128), (16, 32)])
def test_dequantize_matches_the_reference_decode(strategy):
    rng = np.random.default_rng(5)
    codes = random_codes(rng, (200, 300))
    scale = rng.uniform(0.1, 3.0, scale_shape(strategy, 200, 300)).astype(np.float32)
    got = fp8.dequantize(codes, scale, strategy)
    assert got.dtype == np.float32
    assert np.array_equal(got, decode(codes, scale, strategy))
    if strategy == (128, 128):  # a block's scale ends at its edge: spot-check one element
        assert got[130, 129] == TABLE[codes[130, 129]] * scale[1, 1]


def test_block_fp8_checkpoint_runs_as_its_float32_values(tmp_path):
    quant, plain = quantize_checkpoint("phi3", lambda _: tuple(BLOCK), "_scale_inv")
    fp8_dir = write_dir(tmp_path / "fp8", "phi3", quant, HF_FP8)
    f32_dir = write_dir(tmp_path / "f32", "phi3", plain)
    loaded = load_model(fp8_dir)
    layer = loaded.weights.layers[1]
    want = plain["model.layers.1.self_attn.qkv_proj.weight"]
    assert layer.qkv[0].data.dtype == np.float32 and np.array_equal(layer.qkv[0].data, want)
    assert np.array_equal(layer.down.data, plain["model.layers.1.mlp.down_proj.weight"])
    same_logits(fp8_dir, f32_dir)


def test_compressed_tensors_checkpoint_runs_as_its_float32_values(tmp_path, caplog):
    """Per-channel attention and per-tensor MLP scales (two config groups), bf16 scales, and
    static activation scales that a weight-only dequantization leaves out (one log line)."""

    def strategy_of(name):
        return "channel" if "self_attn" in name else "tensor"

    quant, plain = quantize_checkpoint("mistral", strategy_of, "_scale", bf16_scales=True)
    for name in [n for n in quant if n.endswith("_proj.weight")]:
        quant[name.removesuffix("weight") + "input_scale"] = np.array([0.25], np.float32)
    config = compressed("channel", "tensor", static=True)
    fp8_dir = write_dir(tmp_path / "fp8", "mistral", quant, config)
    f32_dir = write_dir(tmp_path / "f32", "mistral", plain)
    with caplog.at_level(logging.INFO, logger="vtllm.models.fp8"):
        loaded = load_model(fp8_dir)
    assert sum("input_scale" in r.getMessage() for r in caplog.records) == 1
    q = loaded.weights.layers[0].qkv[0].data
    assert np.array_equal(q, plain["model.layers.0.self_attn.q_proj.weight"])
    same_logits(fp8_dir, f32_dir)


def _tiny_fp8(tmp_path, quantization, *, drop=None, dtypes=None, nan=False) -> Path:
    quant, _ = quantize_checkpoint("phi3", lambda _: tuple(BLOCK), "_scale_inv")
    if drop:
        del quant[drop]
    if nan:
        quant["model.layers.0.mlp.down_proj.weight"][3, 5] = 0xFF
    return write_dir(tmp_path, "phi3", quant, quantization, dtypes)


QKV = "model.layers.0.self_attn.qkv_proj.weight"


@pytest.mark.parametrize(
    "quantization,kwargs,error,message",
    [
        (HF_FP8, {"dtypes": {QKV: "float8_e5m2"}}, UnsupportedModel, "dtype F8_E5M2"),
        ({**HF_FP8, "fmt": "e5m2"}, {}, UnsupportedModel, "fmt 'e5m2'"),
        (HF_FP8, {"drop": QKV + "_scale_inv"}, ModelLoadError, "weight_scale_inv is missing"),
        ({**HF_FP8, "weight_block_size": [32, 32]}, {}, ModelLoadError, "has shape .* needs"),
        (HF_FP8, {"nan": True}, ModelLoadError, "NaN codes"),
        ({"quant_method": "awq", "bits": 4}, {}, UnsupportedModel, "quant_method 'awq'"),
        ({**compressed("channel"), "format": "pack-quantized"}, {}, UnsupportedModel, "format"),
        (None, {}, UnsupportedModel, "F8_E4M3 but there is no quantization_config"),
    ],
)
def test_refusals_name_the_field(tmp_path, quantization, kwargs, error, message):
    directory = _tiny_fp8(tmp_path, quantization or {}, **kwargs)
    if quantization is None:
        cfg = json.loads((directory / "config.json").read_text())
        del cfg["quantization_config"]
        (directory / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(error, match=message) as info:
        load_model(directory)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "weights,message",
    [
        ({"type": "int", "num_bits": 4, "strategy": "group"}, "type 'int' num_bits 4"),
        ({"type": "int", "num_bits": 8, "strategy": "channel"}, "type 'int' num_bits 8"),
        (None, "weights is null \\(activation-only"),
        ({"type": "float", "num_bits": 8, "strategy": "token"}, "strategy 'token'"),
    ],
)
def test_unsupported_compressed_tensors_schemes(weights, message):
    config = compressed("channel")
    config["config_groups"]["group_0"]["weights"] = weights
    with pytest.raises(UnsupportedModel, match="config_groups.group_0.*" + message):
        fp8.read_scheme({"quantization_config": config}, Path("config.json"))
