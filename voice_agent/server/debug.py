"""Debug endpoints, only with ``--debug-endpoints`` (off by default): a
window into a running server for soak tests and leak hunts.

``GET /debug/memory`` counts what lives in the process: asyncio tasks,
threads, calls, live aiortc/aioice objects and this server's own per-call
objects, glibc's heap (in use vs. free but kept), and, with ``?types=1``,
every gc-tracked object by type. The front of ``--workers N`` adds each
media worker's own counts (where its calls and their objects live), with
its pid. ``POST /debug/malloc-trim`` gives glibc's
free pages back (which tells a leak from the allocator keeping them).
``POST /debug/tracemalloc`` stores a snapshot (when the process runs with
``PYTHONTRACEMALLOC``) and ``GET /debug/tracemalloc`` diffs the heap against
it by allocating line.

These walk every object on the event loop (tens of milliseconds to a second):
they are for measuring, never for a server taking real traffic.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
import tracemalloc
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from voice_agent.memory import TRIMMER, heap_stats, trim_heap
from voice_agent.server.errors import error_response

# Counted by class, each found in its module once that module is loaded:
# a process that never loaded aiortc (the front of media workers) has
# none of its objects, and counting them must not load it.
# MediaStreamTrack covers its subclasses (ours and aiortc's remote
# tracks), as each of them holds a call's buffers.
TRACKED: dict[str, tuple[str, str]] = {
    "RTCPeerConnection": ("aiortc", "RTCPeerConnection"),
    "RTCIceGatherer": ("aiortc", "RTCIceGatherer"),
    "RTCIceTransport": ("aiortc", "RTCIceTransport"),
    "RTCDtlsTransport": ("aiortc", "RTCDtlsTransport"),
    "RTCSctpTransport": ("aiortc", "RTCSctpTransport"),
    "RTCDataChannel": ("aiortc", "RTCDataChannel"),
    "RTCRtpTransceiver": ("aiortc", "RTCRtpTransceiver"),
    "RTCRtpSender": ("aiortc", "RTCRtpSender"),
    "RTCRtpReceiver": ("aiortc", "RTCRtpReceiver"),
    "MediaStreamTrack": ("aiortc", "MediaStreamTrack"),
    "aioice.Connection": ("aioice", "Connection"),
    "Call": ("voice_agent.rtc.call", "Call"),
    "VoiceSession": ("voice_agent.session.session", "VoiceSession"),
    "Reply": ("voice_agent.session.reply", "Reply"),
}


def tracked_classes() -> dict[str, type | None]:
    """Each tracked name's class, None where its module is not loaded."""
    found: dict[str, type | None] = {}
    for name, (module, attribute) in TRACKED.items():
        loaded = sys.modules.get(module)
        found[name] = getattr(loaded, attribute) if loaded is not None else None
    return found


BASELINE: web.AppKey[list[tracemalloc.Snapshot]] = web.AppKey("tracemalloc_baseline", list)


def live_objects(objects: list[Any]) -> dict[str, int]:
    classes = tracked_classes()
    counts = dict.fromkeys(TRACKED, 0)
    # By each type's MRO, not isinstance(): MediaStreamTrack is an ABC, and
    # isinstance() against it would cache every type in the process in its
    # weak negative cache (a weakref and a callback each), which then looks
    # like growth to the very counts taken here.
    names_by_type: dict[type, list[str]] = {}
    for obj in objects:
        kind = type(obj)
        names = names_by_type.get(kind)
        if names is None:
            names = [name for name, cls in classes.items() if cls in kind.__mro__]
            names_by_type[kind] = names
        for name in names:
            counts[name] += 1
    return counts


def objects_by_type(objects: list[Any]) -> dict[str, int]:
    counts = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in objects)
    return dict(counts)


# Each media worker's /debug/memory (``?types=1`` passed on), as the front reads them.
WorkersMemory = Callable[[bool], Awaitable[list[dict[str, Any]]]]


def add_debug_routes(
    app: web.Application, count_calls: Callable[[], int], workers: WorkersMemory | None = None
) -> None:
    async def memory(request: web.Request) -> web.StreamResponse:
        types = bool(request.query.get("types"))
        gc.collect()
        objects = gc.get_objects()
        body: dict[str, Any] = {
            "tasks": len(asyncio.all_tasks()),
            "threads": threading.active_count(),
            "calls": count_calls(),
            "gc_objects": len(objects),
            "objects": live_objects(objects),
            "heap": heap_stats(),
            "trims_after_calls": TRIMMER.stats(),
        }
        if types:
            body["types"] = objects_by_type(objects)
        del objects
        if workers is not None:
            body["workers"] = await workers(types)
        return web.json_response(body)

    async def snapshot(request: web.Request) -> web.StreamResponse:
        if not tracemalloc.is_tracing():
            return _not_tracing()
        gc.collect()
        app[BASELINE][:] = [tracemalloc.take_snapshot()]
        return web.json_response({"traced_bytes": tracemalloc.get_traced_memory()[0]})

    async def diff(request: web.Request) -> web.StreamResponse:
        if not tracemalloc.is_tracing():
            return _not_tracing()
        if not app[BASELINE]:
            return error_response(409, "no_baseline", "POST /debug/tracemalloc first")
        top = int(request.query.get("top", "25"))
        gc.collect()
        stats = tracemalloc.take_snapshot().compare_to(app[BASELINE][0], "lineno")
        return web.json_response(
            {
                "traced_bytes": tracemalloc.get_traced_memory()[0],
                "growth_bytes": sum(s.size_diff for s in stats),
                "top": [
                    {
                        "where": str(s.traceback),
                        "size_diff": s.size_diff,
                        "count_diff": s.count_diff,
                        "size": s.size,
                    }
                    for s in stats[:top]
                ],
            }
        )

    async def malloc_trim(request: web.Request) -> web.StreamResponse:
        before = rss_bytes()
        seconds = await asyncio.to_thread(trim_heap)
        return web.json_response(
            {"seconds": seconds, "rss_before_bytes": before, "rss_after_bytes": rss_bytes()}
        )

    app[BASELINE] = []
    app.router.add_get("/debug/memory", memory)
    app.router.add_post("/debug/tracemalloc", snapshot)
    app.router.add_get("/debug/tracemalloc", diff)
    app.router.add_post("/debug/malloc-trim", malloc_trim)


def rss_bytes() -> int:
    """This process's resident set size."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _not_tracing() -> web.Response:
    message = "start the server with PYTHONTRACEMALLOC=1 (or more frames) to trace allocations"
    return error_response(409, "not_tracing", message)
