"""executor/host_memory: which mappings count as LLVM's clean code, and numba compiling and
running kernels after they were dropped."""

import numba
import numpy as np

from vtllm.executor.host_memory import clean_library_mappings, release_compiler_pages

SMAPS = """\
7f0000000000-7f0000100000 r--p 00000000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                1024 kB
Anonymous:             0 kB
7f0000100000-7f0000500000 r-xp 00100000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                2048 kB
Anonymous:             0 kB
7f0000500000-7f0000600000 r--p 00500000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                 512 kB
Anonymous:           512 kB
7f0000600000-7f0000610000 rw-p 00600000 08:01 11 /venv/llvmlite/binding/libllvmlite.so
Rss:                  64 kB
Anonymous:            64 kB
7f0000700000-7f0000800000 r-xp 00000000 08:01 12 /usr/lib/libc.so.6
Rss:                 900 kB
Anonymous:             0 kB
7f0000800000-7f0000900000 r-xp 00000000 08:01 13 /opt/lib/libLLVM-14.so
Rss:                   0 kB
Anonymous:             0 kB
7f0000900000-7f0000a00000 rw-p 00000000 00:00 0
Rss:                1024 kB
Anonymous:          1024 kB
"""


def test_only_clean_read_only_pages_of_llvm_count():
    # the relocated read-only part (copy-on-write pages) and the writable data stay, as does
    # every other library; an LLVM mapping with nothing resident is left alone
    assert clean_library_mappings(SMAPS) == [
        (0x7F0000000000, 0x7F0000100000, 1024 * 1024),
        (0x7F0000100000, 0x7F0000500000, 2048 * 1024),
    ]


def test_numba_compiles_and_runs_after_the_pages_are_dropped():
    @numba.njit(cache=False)
    def first(x):
        return x * 2.0 + 1.0

    assert first(np.float64(3.0)) == 7.0  # LLVM's pages are in use again
    assert release_compiler_pages() > 0

    @numba.njit(cache=False)
    def second(x):
        return np.sqrt(x).sum()

    assert second(np.full(4, 9.0)) == 12.0
    assert first(np.float64(1.0)) == 3.0
