"""Running summaries of a measured duration, for ``/v1/stats``."""

from __future__ import annotations

from collections import deque


class Durations:
    """Count, total, max and recent values (for percentiles) of one quantity."""

    def __init__(self, keep: int = 1000) -> None:
        self.count = 0
        self.total = 0.0
        self.max = 0.0
        self._recent: deque[float] = deque(maxlen=keep)

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.max = max(self.max, value)
        self._recent.append(value)

    def summary_ms(self) -> dict[str, float | int]:
        recent = sorted(self._recent)

        def pct(p: float) -> float:
            return round(recent[min(len(recent) - 1, int(p * len(recent)))] * 1000, 2)

        return {
            "count": self.count,
            "mean_ms": round(self.total / self.count * 1000, 2) if self.count else 0.0,
            "p50_ms": pct(0.5) if recent else 0.0,
            "p95_ms": pct(0.95) if recent else 0.0,
            "max_ms": round(self.max * 1000, 2),
        }
