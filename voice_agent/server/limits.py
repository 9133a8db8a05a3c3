"""Per-client rate limits on new calls: a token bucket of offers per client
address, so one client's flood of offers (good or bad) is answered 429 with
Retry-After while other clients go on calling."""

from __future__ import annotations

import math

from voice_agent.ratelimit import TokenBucket

MAX_TRACKED_CLIENTS = 10_000  # bounded memory under a flood from many addresses


class OfferRateLimiter:
    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._buckets: dict[str, TokenBucket] = {}
        self.refused = 0

    def take(self, client: str) -> float | None:
        """Spend one offer for ``client``: None if allowed, else the seconds
        until the next one would be."""
        if self.per_minute <= 0:
            return None  # off
        bucket = self._buckets.get(client)
        if bucket is None:
            if len(self._buckets) >= MAX_TRACKED_CLIENTS:
                self._forget()
            bucket = self._buckets[client] = TokenBucket(self.per_minute / 60.0, self.per_minute)
        wait_s = bucket.take()
        if wait_s is not None:
            self.refused += 1
        return wait_s

    def _forget(self) -> None:
        """Drop clients whose buckets have refilled (they are as if new), or
        else the older half."""
        full = [client for client, bucket in self._buckets.items() if bucket.full]
        for client in full or list(self._buckets)[: len(self._buckets) // 2]:
            del self._buckets[client]


def retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))
