"""Event-loop health: how late the loop runs its callbacks (lag p50/p99/max
over a recent window), and which callback blocked it when it stalled.

A heartbeat timer on the loop measures the loop's own lateness: scheduled
with ``call_at`` every ``interval_s``, it records how long after its due time
it ran. A blocked loop cannot report on itself while it is blocked, so a
watchdog thread sleeps until a heartbeat is overdue by the stall threshold
and then samples the loop thread's stack (``sys._current_frames``): the code
that is blocking, the callback (asyncio Handle) being run and its task. When
the loop gets going again the late heartbeat records the stall with that
sample and logs a warning naming the culprit.

While the service starts (``starting()``: its models load, holding the GIL
in long stretches) stalls are expected and no call can meet them: they are
logged at INFO and counted apart, so that an operator's alert on stalls
means a stall that a call could have heard.

asyncio's debug mode (``slow_callback_duration``) times every callback
exactly, but it also records a traceback for every callback scheduled: a
task step took 20-50x as long in bench/loop_health.py. This costs one timer
callback per interval and a thread that wakes about once per stall
threshold: 0.17 % of one core on an idle loop, nothing measurable per
callback on a busy one.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

# 10 heartbeats a second: a 300 ms block shows as a lag of 200-300 ms; twice
# as many would double the idle cost (bench/loop_health.py).
HEARTBEAT_INTERVAL_S = 0.1
WINDOW_S = 60.0
STALLS_KEPT = 20
SLOWEST_SHOWN = 5
STACK_FRAMES = 12  # the innermost frames kept of a stall
# A stall this long is reported while it lasts (by the watchdog), not only
# when it ends: a loop that never gets going again would otherwise say nothing.
HUNG_AFTER_S = 5.0
_HANDLE_RUN = asyncio.events.Handle._run.__code__


@dataclass(frozen=True)
class LoopSample:
    """What the loop thread was doing, seen from the watchdog."""

    stack: tuple[str, ...]  # outermost first, "file:line in function: source"
    culprit: str  # the innermost frame: the function that is blocking
    handle: str | None  # the asyncio callback being run
    task: str | None  # the task whose step it is, if any


NOT_SAMPLED = LoopSample((), "unknown (the watchdog did not see it)", None, None)
NO_CALLBACK = "no callback (the loop was waiting: its thread got no CPU)"


@dataclass(frozen=True)
class Stall:
    at: float  # wall-clock time the loop got going again
    blocked_ms: float  # how late the heartbeat ran: a lower bound of the block
    sample: LoopSample

    def json(self) -> dict[str, Any]:
        return {
            "at": round(self.at, 3),
            "blocked_ms": round(self.blocked_ms, 1),
            "culprit": self.sample.culprit,
            "task": self.sample.task,
            "handle": self.sample.handle,
            "stack": list(self.sample.stack),
        }


class LoopHealthMonitor:
    def __init__(
        self,
        stall_threshold_s: float = 0.1,
        interval_s: float = HEARTBEAT_INTERVAL_S,
        window_s: float = WINDOW_S,
        hung_after_s: float = HUNG_AFTER_S,
    ) -> None:
        self.stall_threshold_s = stall_threshold_s
        self.hung_after_s = hung_after_s
        self.interval_s = interval_s
        self.window_s = window_s
        self._lags: deque[float] = deque(maxlen=max(1, round(window_s / interval_s)))
        self._stalls: deque[Stall] = deque(maxlen=STALLS_KEPT)
        self.stalls_total = 0
        self.stalls_while_starting = 0
        self._starting = 0  # how many start-ups are under way (nested is fine)
        self._started_at = -math.inf  # loop.time() when the last one ended
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._timer: asyncio.TimerHandle | None = None
        # loop.time() when the next heartbeat is due; the watchdog reads it
        # (one float: written and read whole under the GIL).
        self._due = 0.0
        self._watchdog: threading.Thread | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._sample: tuple[float, LoopSample] | None = None  # (due, sample) of this stall
        # How many stalls the watchdog has sampled while they lasted: a stall
        # that ended before the watchdog thread got the CPU is logged unnamed.
        self.samples_taken = 0
        # The generation being collected, while the garbage collector runs:
        # it stops every thread, and the frame it interrupted is no culprit.
        self._collecting: int | None = None

    @property
    def running(self) -> bool:
        return self._timer is not None

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        """Start watching the running loop (call from its thread)."""
        if self.running:
            return
        loop = self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._stop.clear()
        gc.callbacks.append(self._on_gc)
        self._schedule(loop.time())
        self._watchdog = threading.Thread(
            target=self._watch, args=(loop,), name="loop-health-watchdog", daemon=True
        )
        self._watchdog.start()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._stop.set()
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._watchdog is not None:
            self._watchdog.join(timeout=2.0)
            self._watchdog = None

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        self._collecting = info["generation"] if phase == "start" else None

    async def run(self) -> AsyncIterator[None]:
        """Watch while the caller's ``yield`` lasts (an aiohttp cleanup context)."""
        self.start()
        try:
            yield
        finally:
            self.stop()

    @contextmanager
    def starting(self) -> Iterator[None]:
        """Stalls in this block are start-up's (models loading), not a call's."""
        self._starting += 1
        try:
            yield
        finally:
            self._starting -= 1
            self._started_at = asyncio.get_running_loop().time()

    def _in_start_up(self, due: float) -> bool:
        """Whether a stall whose heartbeat was due at ``due`` began while the
        service was starting (it may end after start-up has)."""
        return bool(self._starting) or due <= self._started_at

    # -- on the loop ---------------------------------------------------------------
    def _schedule(self, now: float) -> None:
        assert self._loop is not None
        self._due = now + self.interval_s
        self._timer = self._loop.call_at(self._due, self._beat)

    def _beat(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        lag = max(0.0, now - self._due)
        self._lags.append(lag)
        if lag >= self.stall_threshold_s:
            self._record_stall(lag)
        self._schedule(now)

    def _record_stall(self, lag: float) -> None:
        with self._lock:
            taken, self._sample = self._sample, None
        # A stall just over the threshold may end before the watchdog looks.
        sample = taken[1] if taken is not None and taken[0] == self._due else NOT_SAMPLED
        stall = Stall(time.time(), lag * 1000.0, sample)
        extra = {
            "blocked_ms": round(stall.blocked_ms, 1),
            "culprit": sample.culprit,
            "task": sample.task,
            "handle": sample.handle,
            "stack": list(sample.stack),
        }
        if self._in_start_up(self._due):
            self.stalls_while_starting += 1
            log.info(
                "event loop blocked for %.0f ms by %s while the service starts",
                stall.blocked_ms,
                sample.culprit,
                extra=extra,
            )
            return
        self._stalls.append(stall)
        self.stalls_total += 1
        log.warning(
            "event loop blocked for %.0f ms by %s", stall.blocked_ms, sample.culprit, extra=extra
        )

    def snapshot(self) -> dict[str, Any]:
        """Lag percentiles over the window, stalls and the slowest recent ones."""
        lags = sorted(self._lags)
        slowest = sorted(self._stalls, key=lambda s: s.blocked_ms, reverse=True)
        return {
            "lag_p50_ms": round(_percentile(lags, 0.50) * 1000.0, 2),
            "lag_p99_ms": round(_percentile(lags, 0.99) * 1000.0, 2),
            "lag_max_ms": round((lags[-1] if lags else 0.0) * 1000.0, 2),
            "window_s": round(len(lags) * self.interval_s, 1),
            "stall_threshold_ms": round(self.stall_threshold_s * 1000.0, 1),
            "stalls": self.stalls_total,
            "stalls_while_starting": self.stalls_while_starting,
            "slowest": [s.json() for s in slowest[:SLOWEST_SHOWN]],
        }

    # -- on the watchdog thread -----------------------------------------------------
    def _watch(self, loop: asyncio.AbstractEventLoop) -> None:
        seen_due = -1.0  # the heartbeat whose stall was sampled already
        hung_told = -1.0
        while True:
            due = self._due
            overdue = loop.time() - due  # loop.time() is time.monotonic(): thread-safe
            if overdue < self.stall_threshold_s:
                if self._stop.wait(self.stall_threshold_s - overdue):
                    return
                continue
            if due != seen_due:
                seen_due = due
                sample = self._sample_loop()
                with self._lock:
                    self._sample = (due, sample)
                    self.samples_taken += 1
            elif overdue >= self.hung_after_s and due != hung_told:
                hung_told = due
                sample = self._sample_loop()
                starting = self._in_start_up(due)
                (log.info if starting else log.error)(
                    "event loop blocked for %.1f s so far by %s%s",
                    overdue,
                    sample.culprit,
                    " while the service starts" if starting else "",
                    extra={"culprit": sample.culprit, "stack": list(sample.stack)},
                )
            if self._stop.wait(self.stall_threshold_s):
                return

    def _sample_loop(self) -> LoopSample:
        """What the loop's thread is running, read from the watchdog thread;
        whatever goes wrong reading it, the watchdog goes on."""
        try:
            return self._read_loop_stack()
        except Exception as exc:
            log.warning("could not sample the event loop's stack: %r", exc)
            return NOT_SAMPLED

    def _read_loop_stack(self) -> LoopSample:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return NOT_SAMPLED
        # The frames inside the callback being run (the loop's own frames
        # above it say nothing), innermost first, and the Handle running it.
        inside: list[tuple[FrameType, int]] = []
        handle = None
        walked: FrameType | None = frame
        while walked is not None:
            if walked.f_code is _HANDLE_RUN:
                # The callback is the frame Handle._run called. Only code
                # objects and line numbers are read here: reading a running
                # frame's f_locals from another thread mutates it (and once
                # failed inside CPython with a SystemError).
                called = inside[-1][0] if inside else walked
                handle = (
                    f"{called.f_code.co_name} "
                    f"({_short(called.f_code.co_filename)}:{called.f_code.co_firstlineno})"
                )
                break
            inside.append((walked, walked.f_lineno or 0))
            walked = walked.f_back
        summary = traceback.StackSummary.extract(reversed(inside[:STACK_FRAMES]))
        stack = tuple(
            f"{_short(f.filename)}:{f.lineno} in {f.name}" + (f": {f.line}" if f.line else "")
            for f in summary
        )
        innermost = summary[-1] if summary else None
        collecting = self._collecting
        if collecting is not None:
            culprit = f"garbage collection (generation {collecting})"
        elif handle is None:
            # Between callbacks (in select, most likely): nothing blocked the
            # loop; its thread did not get the CPU (an overloaded or paused host).
            culprit = NO_CALLBACK
        elif innermost is not None:
            culprit = f"{innermost.name} ({_short(innermost.filename)}:{innermost.lineno})"
        else:
            culprit = "unknown"
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        return LoopSample(stack, culprit, handle, _safe_repr(task) if task is not None else None)


def _safe_repr(value: object) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a broken __repr__ must not end the watchdog
        text = f"<repr failed: {type(exc).__name__}>"
    return text[:300]


def _short(path: str) -> str:
    """A path relative to the working directory or site-packages, for logs."""
    prefixes = [os.getcwd(), *(entry for entry in sys.path if entry)]
    matches = [p for p in prefixes if path.startswith(p.rstrip(os.sep) + os.sep)]
    if not matches:
        return path
    return path[len(max(matches, key=len).rstrip(os.sep)) + 1 :]


def _percentile(ordered: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 when empty)."""
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
