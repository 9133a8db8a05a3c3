"""Per-client rate limits on new calls: a token bucket of offers per client
address, so one client's flood of offers (good or bad) is answered 429 with
Retry-After while other clients go on calling."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

MAX_TRACKED_CLIENTS = 10_000  # bounded memory under a flood from many addresses


@dataclass
class _Bucket:
    tokens: float
    updated: float


class OfferRateLimiter:
    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._buckets: dict[str, _Bucket] = {}
        self.refused = 0

    def _now(self) -> float:
        return time.monotonic()

    def take(self, client: str) -> float | None:
        """Spend one offer for ``client``: None if allowed, else the seconds
        until the next one would be."""
        if self.per_minute <= 0:
            return None  # off
        now = self._now()
        rate = self.per_minute / 60.0
        bucket = self._buckets.get(client)
        if bucket is None:
            if len(self._buckets) >= MAX_TRACKED_CLIENTS:
                self._forget_full(now, rate)
            bucket = self._buckets[client] = _Bucket(float(self.per_minute), now)
        bucket.tokens = min(self.per_minute, bucket.tokens + (now - bucket.updated) * rate)
        bucket.updated = now
        if bucket.tokens >= 1:
            bucket.tokens -= 1
            return None
        self.refused += 1
        return (1 - bucket.tokens) / rate

    def _forget_full(self, now: float, rate: float) -> None:
        """Drop clients whose buckets have refilled (they are as if new)."""
        full = [
            client
            for client, b in self._buckets.items()
            if b.tokens + (now - b.updated) * rate >= self.per_minute
        ]
        for client in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[client]


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
