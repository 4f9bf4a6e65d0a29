import contextlib
import zlib

import numba
import numpy as np
import pytest


@contextlib.contextmanager
def _threads(n: int):
    """Runs the block with numba using n threads (capped at what the machine has)."""
    before = numba.get_num_threads()
    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        numba.set_num_threads(before)


@pytest.fixture
def threads():
    """`with threads(1): ...` - the thread count must never change a kernel's bits."""
    return _threads


@pytest.fixture
def rng(request):
    """Fresh random inputs, reproducible per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
