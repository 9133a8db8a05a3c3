"""The C heap (glibc malloc): what it holds, and giving its free pages back.

Python's small objects live in pymalloc arenas, but everything larger (NumPy
buffers, Opus/SRTP/OpenSSL state, ONNX and CTranslate2 scratch) comes from
malloc. glibc gives each thread that allocates its own arena (up to 8 per
core) and returns freed memory to the kernel only from the top of each
heap, so a server whose calls start and stop threads and allocate from all
of them keeps freed-but-fragmented pages resident. ``malloc_trim(0)`` walks
every arena and releases their free pages (``MADV_DONTNEED``), which is what
bounds the resident size between calls. Elsewhere than glibc (musl, macOS,
jemalloc preloaded) these are no-ops that report nothing.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import re
import time

log = logging.getLogger(__name__)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",  # bytes obtained from the kernel by sbrk/heaps, all arenas
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",  # bytes in mmap()ed chunks (large allocations)
            "usmblks",
            "fsmblks",
            "uordblks",  # bytes in use
            "fordblks",  # bytes free but kept
            "keepcost",
        )
    ]


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    if hasattr(ctypes.CDLL(None), "mallctl"):
        return None  # jemalloc preloaded: glibc's heap is not the one in use
    if not all(hasattr(libc, name) for name in ("mallinfo2", "malloc_trim", "malloc_info")):
        return None  # not glibc >= 2.33
    libc.mallinfo2.restype = _MallInfo2
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    libc.open_memstream.restype = ctypes.c_void_p
    libc.open_memstream.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


_LIBC = _load_libc()


def _arena_count(libc: ctypes.CDLL) -> int:
    """Arenas glibc has created (malloc_info's XML has one <heap> each)."""
    buffer, size = ctypes.c_void_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(buffer), ctypes.byref(size))
    if not stream:
        return 0
    libc.malloc_info(0, stream)
    libc.fclose(stream)
    try:
        xml = ctypes.string_at(buffer.value or 0, size.value) if buffer.value else b""
    finally:
        libc.free(buffer)
    return len(re.findall(rb"<heap nr=", xml))


def heap_stats() -> dict[str, int] | None:
    """glibc's own account of the heap, in bytes; None elsewhere."""
    if _LIBC is None:
        return None
    info = _LIBC.mallinfo2()
    return {
        "arenas": _arena_count(_LIBC),
        "heap_bytes": info.arena,
        "mmap_bytes": info.hblkhd,
        "in_use_bytes": info.uordblks + info.hblkhd,
        "free_bytes": info.fordblks,
    }


def trim_heap() -> float | None:
    """Give the heap's free pages back to the kernel; the seconds it took,
    None where there is no glibc. Blocking (it locks each arena in turn):
    call it from a thread, not the event loop."""
    if _LIBC is None:
        return None
    started = time.perf_counter()
    _LIBC.malloc_trim(0)
    return time.perf_counter() - started


class HeapTrimmer:
    """Gives free heap back after each call, in a thread, one trim at a time
    (calls ending during a trim ask for one more, not one each)."""

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._again = False
        self.trims = 0
        self.total_s = 0.0
        self.max_s = 0.0

    def request(self) -> None:
        if _LIBC is None:
            return
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="malloc-trim")

    async def _run(self) -> None:
        while True:
            self._again = False
            seconds = await asyncio.to_thread(trim_heap)
            if seconds is not None:
                self.trims += 1
                self.total_s += seconds
                self.max_s = max(self.max_s, seconds)
                log.debug("heap trimmed", extra={"ms": round(seconds * 1000, 2)})
            if not self._again:
                return

    async def wait(self) -> None:
        """Until the trim in progress (if any) is done."""
        if self._task is not None:
            await asyncio.shield(self._task)

    def stats(self) -> dict[str, float | int]:
        return {
            "trims": self.trims,
            "mean_ms": round(self.total_s / self.trims * 1000, 2) if self.trims else 0.0,
            "max_ms": round(self.max_s * 1000, 2),
        }


# One heap per process, so one trimmer.
TRIMMER = HeapTrimmer()


async def give_back_free_heap() -> None:
    """Collect garbage, then trim the heap (in a thread) and wait for it:
    what start-up allocated and freed (weights read and joined, graphs
    built) goes back to the kernel instead of staying in glibc's arenas."""
    gc.collect()
    TRIMMER.request()
    await TRIMMER.wait()
