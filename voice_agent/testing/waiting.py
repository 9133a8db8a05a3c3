"""Waiting in tests for a state that no event marks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def until(condition: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Wait until ``condition`` holds, checked after every step of the event
    loop (``limit_s`` at most): a state code under test reaches in a step or
    two with no event to mark it (a request queued, a task waiting on a
    thread, a buffer full). Steps, not a clock: it holds on a busy host."""
    async with asyncio.timeout(limit_s):
        while not condition():  # noqa: ASYNC110 - no event marks these states
            await asyncio.sleep(0)
