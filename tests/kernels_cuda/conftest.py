"""CUDA kernels against the numpy references, under numba's simulator or on a real GPU.

NUMBA_ENABLE_CUDASIM is read when numba.cuda is first imported, so the simulator run is its own
pytest process:
    NUMBA_ENABLE_CUDASIM=1 .venv/bin/python -m pytest -q -m cudasim tests/kernels_cuda
Without it the folder runs only where numba.cuda sees a GPU; anywhere else every test in it is
skipped, with the reason in the summary (and in the header when this folder is collected first).
"""

import os
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent


def _skip_reason() -> str | None:
    from numba.core import config

    if config.ENABLE_CUDASIM:
        return None
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return "NUMBA_ENABLE_CUDASIM=1 was set after numba read its config: run a fresh process"
    try:
        from numba import cuda

        if cuda.is_available():
            return None
    except Exception as e:  # a broken driver or toolkit: say so instead of failing collection
        return f"numba.cuda is unusable here: {e}"
    return "no CUDA GPU (numba.cuda.is_available() is False) and NUMBA_ENABLE_CUDASIM is not 1"


SKIP_REASON = _skip_reason()


def pytest_report_header(config):
    mode = "simulator" if SKIP_REASON is None and _simulating() else "GPU"
    return f"kernels_cuda: {'skipped: ' + SKIP_REASON if SKIP_REASON else mode}"


def _simulating() -> bool:
    from numba.core import config

    return bool(config.ENABLE_CUDASIM)


def pytest_collection_modifyitems(config, items):
    if SKIP_REASON is None:
        return
    skip = pytest.mark.skip(reason=f"kernels_cuda: {SKIP_REASON}")
    for item in items:  # this hook sees the whole session's items: touch only this folder's
        if HERE in Path(item.path).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _fast_simulator():
    """The simulator runs each CUDA thread as a Python thread and polls them at barriers; a
    shorter GIL switch interval makes barriers several times faster."""
    if not _simulating():
        yield
        return
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    yield
    sys.setswitchinterval(before)


@pytest.fixture
def rng(request):
    """Fresh random inputs, reproducible per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
