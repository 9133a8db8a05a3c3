"""One pooled keep-alive HTTP session per remote model client: made on the
serving loop at first use (a new connection per request would add TCP and
TLS set-up to every utterance or piece), optionally over a Unix socket,
closed once at shutdown."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from voice_agent.backends.runtime.durations import Durations


class PooledHttpClient:
    name = "remote"

    def __init__(self, url: str, timeout_s: float, unix_socket: str | None = None) -> None:
        self.url = url
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._unix_socket = unix_socket
        self._latency = Durations()
        self._errors = 0
        self._http: aiohttp.ClientSession | None = None
        self._closed = False
        self._closing: asyncio.Task[None] | None = None

    def _closed_error(self) -> Exception:
        return RuntimeError(f"the client for {self.url} is closed")

    def _session(self) -> aiohttp.ClientSession:
        if self._closed:
            raise self._closed_error()
        if self._http is None:
            connector = aiohttp.UnixConnector(path=self._unix_socket) if self._unix_socket else None
            self._http = aiohttp.ClientSession(timeout=self._timeout, connector=connector)
        return self._http

    def stats(self) -> dict[str, object]:
        return {
            "backend": self.name,
            "url": self.url,
            "requests": self._latency.summary_ms(),
            "errors": self._errors,
        }

    async def aclose(self) -> None:
        self._closed = True
        http, self._http = self._http, None
        if http is not None:
            await http.close()

    def close(self) -> None:
        """Synchronous callers: the pool is closed on the running loop."""
        self._closed = True
        if self._http is None:
            return
        with contextlib.suppress(RuntimeError):  # no loop runs: it went with the pool
            self._closing = asyncio.get_running_loop().create_task(self.aclose())
