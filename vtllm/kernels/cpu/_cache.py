"""numba's on-disk cache, made to notice edits to inlined helpers.

A cached kernel embeds the machine code of everything it inlines or calls, but numba stamps
the cache entry with the kernel's own source file only: an edit to a helper module (a decoder,
an intrinsic) would leave a cached kernel running the old helper. `stamp_with` widens the
stamp to the helper modules' files.
"""

import os

import numba


def stamp_with(dispatcher, modules) -> None:
    """Makes the dispatcher's cache stamp cover the source files of `modules` besides its own,
    so that editing any of them recompiles it. Where numba's cache internals differ from the
    ones this was written against, the cache is turned off instead (correct, only slower)."""
    cache_file = getattr(getattr(dispatcher, "_cache", None), "_cache_file", None)
    if cache_file is None or not hasattr(cache_file, "_source_stamp"):
        dispatcher._cache = numba.core.caching.NullCache()
        return
    stamps = [cache_file._source_stamp]
    for module in modules:
        st = os.stat(module.__file__)
        stamps.append((os.path.basename(module.__file__), st.st_mtime, st.st_size))
    cache_file._source_stamp = tuple(stamps)
