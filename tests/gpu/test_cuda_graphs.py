"""CUDA graphs with programmatic edges: each kernel may launch before the one it follows has
finished, and its first statement waits for that one (kernels/cuda/_ptx.grid_dependency_sync)."""

import numpy as np
import pytest

pytestmark = pytest.mark.gpu

N = 1 << 24  # 64 MB a buffer: each kernel runs long enough for a missing wait to show
LAUNCHES = 40


@pytest.fixture(scope="module")
def add_one():
    from numba import cuda

    from vtllm.kernels.cuda._ptx import grid_dependency_sync

    @cuda.jit
    def kernel(src, dst):
        grid_dependency_sync()
        for i in range(cuda.grid(1), src.size, cuda.gridsize(1)):
            dst[i] = src[i] + np.float32(1.0)

    return kernel


@pytest.mark.parametrize("programmatic", [False, True])
def test_chain_of_dependent_kernels_replays_in_order(add_one, programmatic):
    from numba import cuda

    from vtllm.executor.cuda_graphs import CudaGraph
    from vtllm.kernels.cuda._ptx import GRID_DEPENDENCY

    if programmatic and not GRID_DEPENDENCY:
        pytest.skip("programmatic edges need sm_90")
    stream = cuda.stream()
    a = cuda.to_device(np.zeros(N, np.float32), stream=stream)
    b = cuda.device_array(N, np.float32, stream=stream)

    def record():
        for i in range(LAUNCHES):  # a -> b -> a ..: every kernel reads the last one's output
            src, dst = (a, b) if i % 2 == 0 else (b, a)
            add_one[264, 256, stream](src, dst)

    record()  # eager first: compiles
    stream.synchronize()
    graph = CudaGraph(stream, record, programmatic=programmatic)
    try:
        assert graph.num_programmatic == (LAUNCHES - 1 if programmatic else 0)
        for _ in range(3):
            graph.replay()
        out = a.copy_to_host(stream=stream)
        stream.synchronize()
    finally:
        graph.close()
    assert np.array_equal(out, np.full(N, 4 * LAUNCHES, np.float32))
