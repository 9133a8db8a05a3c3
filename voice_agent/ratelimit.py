"""A token bucket: a steady rate with a burst allowance, and how long until
the next token when empty. Used per client address for offers, per
session for data-channel events, and per session for appended audio (in
seconds of audio)."""

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

    def take(self, cost: float = 1.0) -> float | None:
        """Spend ``cost`` tokens: None if there were that many, else the
        seconds until there will be (nothing is spent then)."""
        self._refill()
        if self.tokens >= cost:
            self.tokens -= cost
            return None
        return (cost - self.tokens) / self.rate_per_s

    @property
    def full(self) -> bool:
        self._refill()
        return self.tokens >= self.burst
