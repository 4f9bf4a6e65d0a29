"""The CUDA runner's staged copies of slot state: the sampling table as one buffer, prompts."""

import numpy as np
import pytest
from numba import cuda

from vtllm.executor.staging import PromptStaging, StagedSamplingTable
from vtllm.kernels.sampling_table import TABLE_LAYOUT, SamplingTable

pytestmark = pytest.mark.cudasim


def _device_matches(staged: StagedSamplingTable, table: SamplingTable) -> None:
    for name, (dtype, _width) in TABLE_LAYOUT.items():
        dev = getattr(staged.device, name)
        assert dev.dtype == np.dtype(dtype) and dev.shape == getattr(table, name).shape, name
        np.testing.assert_array_equal(dev.copy_to_host(), getattr(table, name), err_msg=name)


def test_the_table_reaches_the_device_whole_through_each_ring_slot():
    stream = cuda.stream()
    table = SamplingTable.create(5)
    staged = StagedSamplingTable(table, 3, stream)
    _device_matches(staged, table)  # the defaults, sent at creation
    table.set_slot(
        1,
        temperature=0.7,
        top_k=40,
        top_p=0.9,
        min_p=0.05,
        seed=2**63 + 5,
        presence_penalty=0.5,
        frequency_penalty=-0.25,
        repetition_penalty=1.1,
        min_tokens=3,
        num_logprobs=4,
        prompt_len=17,
        logit_bias={7: 2.5, 9: -100.0},
        min_stop_ids=[2, 3],
    )
    table.set_slot(
        4,
        temperature=0.0,
        top_k=0,
        top_p=1.0,
        min_p=0.0,
        seed=1,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        repetition_penalty=1.0,
        min_tokens=0,
        num_logprobs=-1,
        prompt_len=2,
        logit_bias=None,
        min_stop_ids=[],
    )
    for ring in (1, 2, 0):
        staged.send(ring, stream)
        stream.synchronize()
        _device_matches(staged, table)
        table.clear_slot(1 if ring == 1 else 4)
    # what the sampler reads is the same arrays every step (captured graphs hold them)
    views = [getattr(staged.device, name) for name in TABLE_LAYOUT]
    staged.send(1, stream)
    assert all(getattr(staged.device, n) is v for n, v in zip(TABLE_LAYOUT, views, strict=True))


def test_prompts_land_in_their_slots_rows_and_the_staging_grows():
    stream = cuda.stream()
    mirror = cuda.to_device(np.full((4, 12), -1, np.int32))
    staging = PromptStaging(2, 4)
    seats = [(2, np.array([5, 6, 7], np.int32)), (0, np.arange(10, dtype=np.int32))]
    staging.send(1, seats, mirror, stream)  # 13 tokens: past the 4 it started with
    stream.synchronize()
    want = np.full((4, 12), -1, np.int32)
    want[2, :3] = [5, 6, 7]
    want[0, :10] = np.arange(10)
    np.testing.assert_array_equal(mirror.copy_to_host(), want)
    staging.send(0, [(3, np.array([9], np.int32))], mirror, stream)
    stream.synchronize()
    want[3, 0] = 9
    np.testing.assert_array_equal(mirror.copy_to_host(), want)
