"""The CUDA runner's per-slot state sent to the device through pinned staging buffers.

Why: sending the sampling table field by field and each seated prompt as its own copy, from
pageable memory, means many numba copies a step, each with its Python cost on the host, and
a copy from pageable memory may also wait for the stream (the driver stages it through its
own pinned buffer and may synchronize first: CUDA's "API synchronization behavior"). A launch
is on the serving path's critical path (the backend's worker thread queues the collect of
step N behind the launch of N + 1), so a slow launch of a seating step eats into the GPU
step it should overlap. Here the table is one device buffer, each field a view of it (what
the sampler reads, at fixed addresses for the captured graphs), refreshed by one asynchronous
copy a step; prompts go through a pinned buffer too (BENCHMARKS.md, GPU serving). Each
staging buffer belongs to one of the runner's ring slots and is written only once that
slot's last step is done (CudaModelRunner.launch waits for its event first).
"""

import numpy as np
from numba import cuda

from vtllm.kernels.sampling_table import TABLE_LAYOUT, SamplingTable

ALIGN = 8  # bytes: every field starts aligned for its widest type (the uint64 seeds)


def _table_layout(max_slots: int) -> tuple[dict, int]:
    """name -> (byte offset, bytes, dtype, shape) of each field in one buffer; its size."""
    fields, at = {}, 0
    for name, (dtype, width) in TABLE_LAYOUT.items():
        shape = (max_slots, width) if width else (max_slots,)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        fields[name] = (at, nbytes, np.dtype(dtype), shape)
        at += -(-nbytes // ALIGN) * ALIGN
    return fields, at


def _views(buffer, fields: dict) -> dict:
    """Each field's typed, shaped view of a byte buffer (host or device)."""
    return {
        name: buffer[at : at + nbytes].view(dtype).reshape(shape)
        for name, (at, nbytes, dtype, shape) in fields.items()
    }


class StagedSamplingTable:
    """The device copy of a host SamplingTable (`device`), sent whole in one copy."""

    def __init__(self, table: SamplingTable, ring: int, stream):
        self.table = table
        fields, size = _table_layout(len(table.temperature))
        self.buffer = cuda.device_array(size, np.uint8, stream=stream)
        self.device = SamplingTable(**_views(self.buffer, fields))
        self._staging = [cuda.pinned_array(size, np.uint8) for _ in range(ring)]
        self._staged = [_views(host, fields) for host in self._staging]
        self.send(0, stream)
        stream.synchronize()  # ring slot 0's buffer is free again for the first step

    def send(self, ring: int, stream) -> None:
        """Copies the host table to the device, staged in ring slot `ring`'s buffer."""
        for name, view in self._staged[ring].items():
            view[...] = getattr(self.table, name)
        self.buffer.copy_to_device(self._staging[ring], stream=stream)


class PromptStaging:
    """Seated prompts' ids to the device mirror, through a pinned buffer per ring slot that
    grows (rarely: it starts at a step's worth of tokens) to the step's seated tokens."""

    def __init__(self, ring: int, tokens: int):
        self._staging = [cuda.pinned_array(max(tokens, 1), np.int32) for _ in range(ring)]

    def send(self, ring: int, seats: list, mirror, stream) -> None:
        """Writes each (slot, ids) of seats into mirror[slot, :len(ids)]."""
        total = sum(len(ids) for _, ids in seats)
        if total > len(self._staging[ring]):
            self._staging[ring] = cuda.pinned_array(total, np.int32)
        host, at = self._staging[ring], 0
        for slot, ids in seats:
            n = len(ids)
            host[at : at + n] = ids
            mirror[slot, :n].copy_to_device(host[at : at + n], stream=stream)
            at += n
