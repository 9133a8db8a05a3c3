"""Is a remote LLM endpoint reachable? Asked with ``GET {base}/models``,
which OpenAI, vLLM, llama.cpp and the Hugging Face router all answer without
billing anything. A failure is only a warning: the endpoint may come up
later, and the answer is refreshed when it is asked for again."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

REFRESH_AFTER_S = 10.0


class RemoteLlmProbe:
    def __init__(self, base_url: str, api_key: str | None, timeout_s: float = 3.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.reachable: bool | None = None  # None: never asked
        self.error: str | None = None
        self.checked_at: float | None = None
        self._checked_monotonic = 0.0
        self._refresh: asyncio.Task[None] | None = None

    async def check(self) -> None:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.get(f"{self.base_url}/models", headers=headers) as response,
            ):
                await response.read()
                # Any HTTP answer means the server is up; a 401 says more.
                self.reachable = True
                self.error = (
                    f"HTTP {response.status} from /models: check --llm-api-key"
                    if response.status in (401, 403)
                    else None
                )
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self.reachable = False
            self.error = f"{type(exc).__name__}: {exc}".rstrip(": ")
        self.checked_at = time.time()
        self._checked_monotonic = time.monotonic()
        if not self.reachable or self.error:
            log.warning(
                "llm endpoint check failed",
                extra={"base_url": self.base_url, "error": self.error},
            )

    def refresh_if_stale(self) -> None:
        """Re-ask in the background if the last answer was bad and old; the
        caller (a health probe) never waits on a remote server."""
        stale = time.monotonic() - self._checked_monotonic > REFRESH_AFTER_S
        bad = self.reachable is False or self.error is not None
        if bad and stale and (self._refresh is None or self._refresh.done()):
            self._refresh = asyncio.create_task(self.check(), name="llm-endpoint-check")

    def health(self) -> dict[str, Any]:
        return {
            "kind": "remote",
            "base_url": self.base_url,
            "reachable": self.reachable,
            "error": self.error,
            "checked_at": round(self.checked_at, 3) if self.checked_at else None,
        }

    async def aclose(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)
