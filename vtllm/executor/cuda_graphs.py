"""CUDA graph capture and replay of numba launches, through the driver API (cuda-python).

numba has no graph API of its own, but its kernels launch onto a stream we own: putting that
stream in capture mode records every launch made on it into a graph instead of running it.
Capture mode is RELAXED so that numba's own bookkeeping calls on other threads stay legal;
what matters is enforced by the caller: the captured launches were warmed up eagerly first
(compiled, placeholders made) and allocate nothing.
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


class CudaGraph:
    """The launches `record()` makes on `stream`, captured once and replayed on that stream."""

    def __init__(self, stream, record):
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
