"""Hand freed heap memory back to the operating system when the server goes idle.

glibc keeps memory freed by other threads in per-thread arenas, and a long-lived server that allocates KV
caches and activations of many sizes from several threads ends up holding hundreds of MB it no longer uses
(fragmented arenas that are never at a heap's top, so never shrunk). `malloc_trim(0)` returns those free
pages; it walks every arena, so it runs once per busy period, when the last generation has ended, not per
request. Other C libraries (musl, macOS) have no such call: there it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache


@cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim") if name else None
    except (OSError, AttributeError):
        return None


def release_free_memory() -> bool:
    """Return the allocator's free pages to the OS (glibc); whether anything could be asked for."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
