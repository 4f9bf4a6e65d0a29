"""A small GGUF reader: metadata as Python values, tensors as views into one memory map.

The gguf package's reader builds a numpy view per metadata element, which is slow on a large
vocabulary; this one parses the header with struct and maps the data once.
"""

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vtllm.kernels import QType, block_layout

_SCALARS = {
    0: ("<B", 1),
    1: ("<b", 1),
    2: ("<H", 2),
    3: ("<h", 2),
    4: ("<I", 4),
    5: ("<i", 4),
    6: ("<f", 4),
    7: ("<?", 1),
    10: ("<Q", 8),
    11: ("<q", 8),
    12: ("<d", 8),
}
_NUMPY = {
    0: "<u1",
    1: "<i1",
    2: "<u2",
    3: "<i2",
    4: "<u4",
    5: "<i4",
    6: "<f4",
    7: "?",
    10: "<u8",
    11: "<i8",
    12: "<f8",
}
_STRING, _ARRAY = 8, 9


@dataclass(slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: the fastest-varying dimension first
    type: int  # GGML type number
    data: np.ndarray  # uint8 view of the tensor's bytes


class GGUFFile:
    def __init__(self, path: Path):
        self.path = Path(path)
        with self.path.open("rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.raw = np.frombuffer(self._map, np.uint8)  # read-only, like the map
        self._buf = memoryview(self.raw)
        self._pos = 0
        if bytes(self._buf[:4]) != b"GGUF":
            raise ValueError("bad magic")
        self._pos = 4
        version, num_tensors, num_kv = self._unpack("<IQQ")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not supported")
        self.fields: dict[str, object] = {}
        for _ in range(num_kv):
            key = self._string()
            (kind,) = self._unpack("<I")
            self.fields[key] = self._value(kind)
        infos = []
        for _ in range(num_tensors):
            name = self._string()
            (ndims,) = self._unpack("<I")
            shape = self._unpack(f"<{ndims}Q")
            kind, offset = self._unpack("<IQ")
            infos.append((name, tuple(int(d) for d in shape), int(kind), int(offset)))
        align = int(self.fields.get("general.alignment", 32))
        start = -(-self._pos // align) * align
        self.tensors = [
            TensorInfo(name, shape, kind, self._tensor_bytes(start + off, shape, kind, name))
            for name, shape, kind, off in infos
        ]

    def release_pages(self) -> None:
        """Drops the file's pages from this process's resident set (they stay in the page
        cache; a later read of a tensor maps its pages back in). Once the loader has copied
        what it fuses (q/k/v, gate/up), the originals' pages would otherwise be counted in
        RSS for the life of the server: ~45 MiB for the default model."""
        if hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def _unpack(self, fmt: str):
        values = struct.unpack_from(fmt, self._buf, self._pos)
        self._pos += struct.calcsize(fmt)
        return values

    def _string(self) -> str:
        (n,) = self._unpack("<Q")
        text = bytes(self._buf[self._pos : self._pos + n]).decode("utf-8", errors="replace")
        self._pos += n
        return text

    def _value(self, kind: int):
        if kind == _STRING:
            return self._string()
        if kind == _ARRAY:
            elem, count = self._unpack("<IQ")
            if elem == _STRING:
                return [self._string() for _ in range(count)]
            if elem in _NUMPY:
                dtype = np.dtype(_NUMPY[elem])
                end = self._pos + count * dtype.itemsize
                values = np.frombuffer(self._buf[self._pos : end], dtype=dtype).tolist()
                self._pos = end
                return values
            return [self._value(elem) for _ in range(count)]
        if kind in _SCALARS:
            return self._unpack(_SCALARS[kind][0])[0]
        raise ValueError(f"unknown metadata value type {kind}")

    def _tensor_bytes(self, offset: int, shape, kind: int, name: str) -> np.ndarray:
        block, nbytes = _block_size(kind, name)
        size = int(np.prod(shape, dtype=np.int64)) // block * nbytes
        if offset + size > self.raw.size:
            raise ValueError(f"tensor {name} runs past the end of the file (truncated?)")
        return self.raw[offset : offset + size]


_FLOAT_BYTES = {QType.F32: 4, QType.F16: 2, QType.BF16: 2}


def _block_size(kind: int, name: str) -> tuple[int, int]:
    """(weights, bytes) of one block of GGML type `kind`. The gguf package (a few MiB resident
    with what it imports) is asked only for the types no kernel reads."""
    try:
        qtype = QType(kind)
    except ValueError:
        qtype = None
    if qtype is not None:
        return (1, _FLOAT_BYTES[qtype]) if qtype in _FLOAT_BYTES else block_layout(qtype)
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise ValueError(f"tensor {name} has unknown type {kind}") from None
