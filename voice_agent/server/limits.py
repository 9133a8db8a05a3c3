"""Per-client rate limits: a token bucket per client (an address, or an
API key), so one client's flood (good requests or bad) is answered 429
with Retry-After while other clients go on. Used for offers per client
address, and for the requests an API key makes besides calls: client
secrets, ICE credentials, the LLM proxy."""

from __future__ import annotations

import math

from aiohttp import web

from voice_agent.ratelimit import TokenBucket
from voice_agent.server.errors import error_response

MAX_TRACKED_CLIENTS = 10_000  # bounded memory under a flood from many addresses


class ClientRateLimiter:
    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self._buckets: dict[str, TokenBucket] = {}
        self.refused = 0

    def take(self, client: str) -> float | None:
        """Spend one request for ``client``: None if allowed, else the
        seconds until the next one would be."""
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


# Per API key (per address with auth off): client secrets, ICE credentials
# and LLM proxy requests, together.
REQUEST_LIMITS: web.AppKey[ClientRateLimiter] = web.AppKey("request_limits", ClientRateLimiter)


def request_rate_refusal(request: web.Request, key_id: str | None) -> web.Response | None:
    """429 when the caller's API key (or address, with auth off) has made
    more than --requests-per-minute-per-key requests lately."""
    limits = request.app[REQUEST_LIMITS]
    wait_s = limits.take(key_id or f"address {request.remote}")
    if wait_s is None:
        return None
    return error_response(
        429,
        "rate_limited",
        f"more than {limits.per_minute} requests a minute with this API key",
        {"Retry-After": retry_after(wait_s)},
    )
