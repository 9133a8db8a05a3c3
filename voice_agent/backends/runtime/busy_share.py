"""How much of the last few seconds a model spent running batches.

Optional work (live partial transcripts) is worth doing only with time the
model would otherwise spend idle: on a loaded host every batch also waits
for the CPU that other calls' LLM and TTS need, so the model's recent busy
share rises with the load as a whole, and optional work that starts then
slows every caller (five callers with partials on: bench/RESULTS.md).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable


class BusyShare:
    """The share of the last ``window_s`` seconds that batches ran, over
    ``lanes`` batches that may run at once (1.0: every lane busy the whole
    window). Used from the event loop only (the batching worker's)."""

    def __init__(
        self, window_s: float = 3.0, lanes: int = 1, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if window_s <= 0 or lanes < 1:
            raise ValueError("window_s must be > 0 and lanes >= 1")
        self._window_s = window_s
        self._lanes = lanes
        self._clock = clock
        self._ended: deque[tuple[float, float]] = deque()  # (start, end) of finished batches
        self._running: dict[int, float] = {}  # a batch's token -> its start

    def started(self, token: int) -> None:
        self._running[token] = self._clock()

    def ended(self, token: int) -> None:
        start = self._running.pop(token, None)
        if start is not None:
            now = self._clock()
            self._ended.append((start, now))
            self._forget_before(now - self._window_s)  # bounded if nobody asks

    def _forget_before(self, since: float) -> None:
        while self._ended and self._ended[0][1] <= since:
            self._ended.popleft()

    def share(self) -> float:
        now = self._clock()
        since = now - self._window_s
        self._forget_before(since)
        spans = [*self._ended, *((start, now) for start in self._running.values())]
        busy = sum(end - max(start, since) for start, end in spans if end > since)
        return min(1.0, busy / (self._window_s * self._lanes))
