"""CUDA graph capture and replay of numba launches, through the driver API (cuda-python).

numba has no graph API of its own, but its kernels launch onto a stream we own: putting that
stream in capture mode records every launch made on it into a graph instead of running it.
Capture mode is RELAXED so that numba's own bookkeeping calls on other threads stay legal;
what matters is enforced by the caller: the captured launches were warmed up eagerly first
(compiled, placeholders made) and allocate nothing.

With `programmatic=True` every kernel -> kernel edge of the captured chain becomes a
programmatic one (programmatic dependent launch, sm_90): a kernel is launched as the blocks of
the one before it exit, not after that kernel has completed and its writes are flushed, and it
waits for that in its first statement (`grid_dependency_sync`, kernels/cuda/_ptx). That trims
the gap between each two of a decode step's few hundred small kernels, which adds up at small
batches (BENCHMARKS.md, GPU decode and prefill). Only kernels that begin with that wait may be
captured this way: every kernel of kernels/cuda does (a test checks).
"""

import math

from numba import cuda


def _driver():
    from cuda.bindings import driver

    return driver


def _ok(result, what: str):
    """Unwraps a cuda-python (err, *values) tuple, raising on an error code."""
    driver = _driver()
    err, *values = result if isinstance(result, tuple) else (result,)
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise RuntimeError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return values[0] if len(values) == 1 else values


def stream_handle(stream):
    """numba's stream as a driver CUstream (its handle is ctypes or a cuda-python object)."""
    handle = stream.handle
    value = getattr(handle, "value", None)
    if value is None:
        value = int(handle)
    return _driver().CUstream(value)


def _make_programmatic(graph) -> int:
    """Turns graph's kernel -> kernel edges into programmatic ones; returns how many."""
    driver = _driver()
    # cuda-python 12 names the variants that take edge data *_v2; in 13 the plain names do
    get_edges = getattr(driver, "cuGraphGetEdges_v2", driver.cuGraphGetEdges)
    remove = getattr(driver, "cuGraphRemoveDependencies_v2", driver.cuGraphRemoveDependencies)
    add = getattr(driver, "cuGraphAddDependencies_v2", driver.cuGraphAddDependencies)
    # A capture from one stream is a chain: fewer edges than nodes + 1; ask for more if not.
    size = _ok(driver.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[1] + 1
    while True:
        sources, targets, data, count = _ok(get_edges(graph, size), "cuGraphGetEdges")
        if count < size:
            break
        size *= 2
    kernel = driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL

    def is_kernel(node) -> bool:
        return _ok(driver.cuGraphNodeGetType(node), "cuGraphNodeGetType") == kernel

    plain = driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_DEFAULT
    listed = zip(sources[:count], targets[:count], data[:count], strict=True)
    edges = [(a, b, d) for a, b, d in listed if d.type == plain and is_kernel(a) and is_kernel(b)]
    if not edges:
        return 0
    a, b, d = (list(column) for column in zip(*edges, strict=True))
    _ok(remove(graph, a, b, d, len(edges)), "cuGraphRemoveDependencies")
    programmatic = driver.CUgraphEdgeData()
    programmatic.from_port = driver.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC
    programmatic.type = driver.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
    _ok(add(graph, a, b, [programmatic] * len(edges), len(edges)), "cuGraphAddDependencies")
    return len(edges)


class CudaGraph:
    """The launches `record()` makes on `stream`, captured once and replayed on that stream;
    programmatic: see the module's docstring (num_programmatic says how many edges became so)."""

    def __init__(self, stream, record, *, programmatic: bool = False):
        driver = _driver()
        self.stream = stream
        self._handle = stream_handle(stream)
        mode = driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED
        _ok(driver.cuStreamBeginCapture(self._handle, mode), "cuStreamBeginCapture")
        try:
            record()
        finally:  # end the capture even when recording failed, or the stream stays unusable
            graph = _ok(driver.cuStreamEndCapture(self._handle), "cuStreamEndCapture")
        self._graph = graph
        self.num_programmatic = _make_programmatic(graph) if programmatic else 0
        self._exec = _ok(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        self.num_nodes = _ok(driver.cuGraphGetNodes(graph, 0), "cuGraphGetNodes")[1]

    def replay(self) -> None:
        _ok(_driver().cuGraphLaunch(self._exec, self._handle), "cuGraphLaunch")

    def close(self) -> None:
        driver = _driver()
        driver.cuGraphExecDestroy(self._exec)
        driver.cuGraphDestroy(self._graph)


def free_device_memory() -> tuple[int, int]:
    """(free, total) bytes of the current device (numba's simulator reports infinity: there
    the device is host memory, so the host's free memory stands in)."""
    free, total = cuda.current_context().get_memory_info()
    if math.isinf(free) or math.isinf(total):
        from vtllm.executor.kv_cache import free_host_memory

        free = total = free_host_memory()
    return int(free), int(total)
