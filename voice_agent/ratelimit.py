"""A token bucket: a steady rate with a burst allowance, and how long until
the next token when empty. Used per client address for offers and per
session for data-channel events."""

from __future__ import annotations

import time


class TokenBucket:
    def __init__(self, rate_per_s: float, burst: float) -> None:
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.tokens = burst
        self._updated = time.monotonic()

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self._updated) * self.rate_per_s)
        self._updated = now

    def take(self) -> float | None:
        """Spend one token: None if there was one, else the seconds until one."""
        self._refill()
        if self.tokens >= 1:
            self.tokens -= 1
            return None
        return (1 - self.tokens) / self.rate_per_s

    @property
    def full(self) -> bool:
        self._refill()
        return self.tokens >= self.burst
