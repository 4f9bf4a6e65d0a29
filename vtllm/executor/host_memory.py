"""Pages a CPU start leaves resident that serving does not use, handed back once it is done.

- LLVM's code. numba links every kernel, cached ones included, through LLVM (libllvmlite.so,
  ~170 MB on disk), and a start faults in ~69 MiB of its read-only pages (its static
  initializers at import, the JIT linker at the first kernel). Serving then runs the kernels'
  own machine code, never LLVM's. Those pages are clean copies of the file: dropping them from
  this process's mapping leaves them in the page cache, and a later compile maps back what it
  runs. Only read-only mappings holding no private (copy-on-write) page are dropped, so no
  byte of the process's state is lost.
- malloc's free space. Load-time temporaries (the permuted q/k copies, the parsed GGUF
  metadata) leave free chunks inside the heap that glibc keeps mapped until asked to trim.

docs/benchmarks/2026-12-07-cpu-memory.md measures both.
"""

import ctypes
import logging
import os

log = logging.getLogger("vtllm.memory")

COMPILER_LIBRARIES = ("libllvmlite", "libLLVM")  # conda's llvmlite links a separate libLLVM
_MADV_DONTNEED = 4  # <sys/mman.h> on Linux


def _libc():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


def clean_library_mappings(smaps: str, names=COMPILER_LIBRARIES) -> list[tuple[int, int, int]]:
    """(start, end, resident bytes) of each read-only mapping of a library in `names` whose
    resident pages are all clean file pages (no Anonymous kB), from /proc/self/smaps's text."""
    out, current = [], None
    for line in smaps.splitlines():
        fields = line.split()
        if not fields:
            continue
        if not fields[0].endswith(":"):  # a mapping's header: range perms offset dev inode path
            current = None
            path = fields[5] if len(fields) > 5 else ""
            if "w" not in fields[1] and os.path.basename(path).startswith(names):
                start, end = (int(a, 16) for a in fields[0].split("-"))
                current = [start, end, 0, None]
                out.append(current)
        elif current is not None and fields[0] == "Rss:":
            current[2] = int(fields[1]) * 1024
        elif current is not None and fields[0] == "Anonymous:":
            current[3] = int(fields[1])
    return [(s, e, rss) for s, e, rss, anon in out if anon == 0 and rss]


def release_compiler_pages() -> int:
    """Drops LLVM's clean read-only pages from the resident set; returns the bytes dropped."""
    libc = _libc()
    try:
        with open("/proc/self/smaps") as f:
            smaps = f.read()
    except OSError:
        return 0
    if libc is None:
        return 0
    released = 0
    for start, end, rss in clean_library_mappings(smaps):
        if libc.madvise(start, end - start, _MADV_DONTNEED) == 0:
            released += rss
    return released


def trim_heap() -> None:
    """Returns malloc's free pages to the system (glibc; elsewhere nothing to do)."""
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None)
    if trim is not None:
        trim(0)


def release_start_pages(when: str) -> None:
    """Both of the above, at a point of the start named by `when` (for the log)."""
    released = release_compiler_pages()
    trim_heap()
    log.debug("%s: %.1f MiB of LLVM's code pages released", when, released / (1 << 20))
