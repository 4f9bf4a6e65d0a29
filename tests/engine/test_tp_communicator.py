"""The shared-memory communicator of tensor parallelism against numpy, across real spawned
processes; small slots, so that arrays go through in several pieces."""

import multiprocessing

import numpy as np
import pytest

from vtllm.executor.communicator import ShmCommunicator, create_shm_group, remove_shm_group

WORLD = 3
SHAPE = (37, 53)  # 7844 bytes of float32: 4 pieces of a 2048-byte slot


def _part(rank: int, dtype=np.float32) -> np.ndarray:
    return np.random.default_rng(100 + rank).standard_normal(SHAPE).astype(dtype)


def _rank_main(group, rank: int, conn) -> None:
    comm = ShmCommunicator(group, rank)
    x = _part(rank)
    comm.all_reduce(x)
    gathered = np.empty((WORLD, *SHAPE), np.float64)
    comm.all_gather(_part(rank, np.float64), gathered)
    comm.barrier()
    conn.send((x, gathered))


@pytest.fixture(scope="module")
def results():
    ctx = multiprocessing.get_context("spawn")
    group = create_shm_group(WORLD, timeout=60.0, slot_bytes=2048)
    pipes = [ctx.Pipe() for _ in range(WORLD)]
    procs = [
        ctx.Process(target=_rank_main, args=(group, r, pipes[r][1]), daemon=True)
        for r in range(WORLD)
    ]
    try:
        for p in procs:
            p.start()
        out = [pipes[r][0].recv() for r in range(WORLD)]
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        remove_shm_group(group)
    return out


def test_all_reduce_is_the_rank_order_sum_on_every_rank(results):
    expected = (_part(0) + _part(1)) + _part(2)  # float32 sums in rank order
    for x, _ in results:
        np.testing.assert_array_equal(x, expected)
    # another order would not be the same bits for every element: the check can fail
    other = (_part(2) + _part(1)) + _part(0)
    assert (other != expected).any()


def test_all_gather_stacks_every_rank_in_order(results):
    expected = np.stack([_part(r, np.float64) for r in range(WORLD)])
    for _, gathered in results:
        np.testing.assert_array_equal(gathered, expected)


def test_all_reduce_refuses_what_it_cannot_sum():
    group = create_shm_group(1, timeout=1.0)
    try:
        comm = ShmCommunicator(group, 0)
        with pytest.raises(ValueError):
            comm.all_reduce(np.zeros(4, np.float64))
        with pytest.raises(ValueError):
            comm.all_gather(np.zeros(4, np.float32), np.zeros((2, 4), np.float32))
        x = np.arange(6, dtype=np.float32)
        comm.all_reduce(x)  # a group of one: its own part
        np.testing.assert_array_equal(x, np.arange(6, dtype=np.float32))
    finally:
        remove_shm_group(group)


def test_nccl_without_its_wheel_is_a_one_line_error():
    """The NCCL communicator cannot run here (no second GPU); without the wheel it refuses."""
    from vtllm.errors import InvalidParameter
    from vtllm.executor.communicator_nccl import NcclCommunicator

    try:
        import nvidia.nccl  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("the nvidia-nccl-cu13 wheel is installed")
    with pytest.raises(InvalidParameter, match="nvidia-nccl-cu13") as info:
        NcclCommunicator.unique_id()
    assert "\n" not in str(info.value)
