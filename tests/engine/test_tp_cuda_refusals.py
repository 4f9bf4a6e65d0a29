"""--tensor-parallel-size N on cuda refuses, in one line and before the model loads, what it
cannot run: more ranks than the GPUs numba.cuda sees, or no NCCL wheel (the `cuda` extra)."""

import subprocess
import sys

import pytest

from vtllm.errors import InvalidParameter
from vtllm.executor import tp_backend


def _visible(monkeypatch, n: int) -> None:
    from numba import cuda

    monkeypatch.setattr(tp_backend, "simulating", lambda: False)
    monkeypatch.setattr(cuda, "is_available", lambda: n > 0)
    monkeypatch.setattr(cuda, "gpus", [object()] * n, raising=False)


def test_more_ranks_than_gpus_is_one_line(monkeypatch):
    _visible(monkeypatch, 1)
    with pytest.raises(InvalidParameter, match="tensor_parallel_size 2 on cuda needs 2 GPUs") as e:
        tp_backend.check_gpu_ranks(2)
    assert "1 visible" in str(e.value) and "\n" not in str(e.value)
    assert e.value.param == "tensor_parallel_size"


def test_a_missing_nccl_wheel_is_one_line(monkeypatch):
    try:
        import nvidia.nccl  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("the nvidia-nccl-cu13 wheel is installed")
    _visible(monkeypatch, 2)
    with pytest.raises(InvalidParameter, match="tensor_parallel_size 2: .*nvidia-nccl-cu13") as e:
        tp_backend.check_gpu_ranks(2)
    assert "\n" not in str(e.value)


def test_cli_exits_2_before_loading_a_model():
    from numba import cuda

    if cuda.is_available() and len(cuda.gpus) >= 64:
        pytest.skip("this host has as many GPUs as ranks asked for")
    command = [sys.executable, "-m", "vtllm", "generate", "/nonexistent/model.gguf"]
    command += ["--prompt", "x", "--device", "cuda", "--tensor-parallel-size", "64"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("vtllm: error")]
    assert len(lines) == 1 and "needs 64 GPUs" in lines[0], done.stderr
