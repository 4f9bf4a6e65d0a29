"""An FP8 checkpoint on the CUDA backend, its matrices kept FP8 on the device (one byte a
weight, packed for the tensor cores): a tiny compressed-tensors checkpoint (per-channel attention
and per-tensor MLP scales, tests/models/test_fp8_checkpoints) teacher-forced against the CPU
runner's float32 logits of the same checkpoint, whose weights are the exact float32 values of
the codes times their scales. Prompt step then one-token steps (the decode kernels, the folded
norms) give the bits of the whole sequence in one step; and a packed FP8 matrix takes half the
device bytes of the bf16 one."""

import numpy as np
import pytest

from tests.models import phi3_tiny
from tests.models.runner_util import make_runner, teacher_forced_logits
from tests.models.test_fp8_checkpoints import compressed, quantize_checkpoint, write_dir
from vtllm.kernels import FP8_ROWS, QType
from vtllm.models.loader import load_model

pytestmark = pytest.mark.gpu

BLOCK = 4


def strategy_of(name):
    return "channel" if "self_attn" in name else "tensor"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    quant, _ = quantize_checkpoint("mistral", strategy_of, "_scale", bf16_scales=True)
    directory = tmp_path_factory.mktemp("fp8") / "mistral"
    return write_dir(directory, "mistral", quant, compressed("channel", "tensor"))


def _cuda_runner(loaded):
    from vtllm.executor.cuda_runner import CudaModelRunner

    return CudaModelRunner(
        loaded,
        block_size=BLOCK,
        max_num_seqs=4,
        max_model_len=64,
        max_num_batched_tokens=64,
        kv_cache_memory=64 << 20,
        kv_cache_fraction=0.0,
        use_graphs=False,
    )


def test_teacher_forced_logits_match_the_cpus(checkpoint):
    ids = phi3_tiny.prompt("mistral")[:32]
    cpu = make_runner(load_model(checkpoint), num_blocks=12, block_size=BLOCK, max_model_len=64)
    want = teacher_forced_logits(cpu, ids, [len(ids)])

    loaded = load_model(checkpoint, fp8_rows=True)
    assert loaded.weights.layers[0].o.qtype == FP8_ROWS
    runner = _cuda_runner(loaded)
    layer = runner.model.w.layers[0]
    assert layer.o.packed and layer.o.data.fp8 and layer.gate_up.data.fp8
    decode = teacher_forced_logits(runner, ids, [20] + [1] * (len(ids) - 20))
    whole = teacher_forced_logits(runner, ids, [len(ids)])
    np.testing.assert_array_equal(decode, whole)  # a row's bits never depend on its step

    assert np.isfinite(whole).all() and want.std() > 0.1
    scale = np.abs(want).max(axis=1, keepdims=True)
    assert np.max(np.abs(whole - want) / scale) < 1e-4  # float32 noise: x ~ 17 bits, W exact
    top2 = np.sort(want, axis=1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 1e-2
    assert clear.mean() > 0.5
    assert np.array_equal(whole.argmax(1)[clear], want.argmax(1)[clear])


def test_fp8_matrix_takes_half_the_device_bytes_of_bf16():
    from numba import cuda

    from vtllm.kernels.cuda.matmul import upload_matrix
    from vtllm.models.synthetic import to_bf16_bits

    n, k = 256, 1024
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 0x7E, (n, k), dtype=np.uint8)
    scale = np.full(n, 0.01, np.float32)
    rows = np.concatenate([codes, scale.view(np.uint8).reshape(n, 4)], axis=1)
    stream = cuda.stream()
    fp8 = upload_matrix(rows, FP8_ROWS, (n, k), stream=stream).data
    bf16 = upload_matrix(
        to_bf16_bits(rng.standard_normal((n, k))), QType.BF16, (n, k), stream=stream
    )
    assert fp8.fp8 and not bf16.data.fp8
    assert 2 * fp8.data.nbytes == bf16.data.data.nbytes  # the packed weights: 1 byte vs 2
    assert fp8.data.nbytes + fp8.scale.nbytes < 0.51 * bf16.data.data.nbytes
