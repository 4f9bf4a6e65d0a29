"""The rows of a step whose attention goes through the decode kernels (the runner's rule)."""

from types import SimpleNamespace

import pytest

from vtllm.executor.cuda_runner import SPLIT_SCRATCH_BYTES, attention_split_rows
from vtllm.kernels.cuda.attention import make_scratch

pytestmark = pytest.mark.cudasim

QWEN3_06B = SimpleNamespace(num_heads=16, head_dim=128)
LLAMA_8B = SimpleNamespace(num_heads=32, head_dim=128)


def _scratch_bytes(config, rows, max_positions):
    acc, ml = make_scratch(rows, config.num_heads, config.head_dim, max_positions)
    return acc.nbytes + ml.nbytes


def test_default_takes_a_serving_steps_prompt_within_the_byte_cap():
    # 4,096 positions: 256 rows fit (~270 MB)
    assert attention_split_rows(QWEN3_06B, 64, 4096, 4097, 0) == 256
    # 8,192 positions of the 8B shape: as many rows as 512 MiB holds
    rows = attention_split_rows(LLAMA_8B, 64, 4096, 8193, 0)
    assert 64 < rows < 256
    assert _scratch_bytes(LLAMA_8B, rows, 8193) <= SPLIT_SCRATCH_BYTES
    assert _scratch_bytes(LLAMA_8B, rows + 1, 8193) > SPLIT_SCRATCH_BYTES


def test_never_fewer_than_the_decode_rows_nor_more_than_a_step():
    # a long context leaves room for few rows: every decode row still gets one
    assert attention_split_rows(LLAMA_8B, 64, 8192, 131073, 0) == 64
    assert attention_split_rows(QWEN3_06B, 64, 4096, 4097, 16) == 64
    assert attention_split_rows(QWEN3_06B, 16, 64, 129, 0) == 64  # steps of 64 tokens at most
    assert attention_split_rows(QWEN3_06B, 16, 4096, 4097, 100) == 100  # the knob, as given
