"""Server-sent events read by the service's own parser.

A test that holds a streamed body as text (it also checks the text
itself) reads its events here, through
``voice_agent.backends.llm.http_client.sse_events``, the parser the LLM client
runs: the events are the ones the service would see, with no second,
hand-written parser to drift from it. Code that holds the response itself
calls ``sse_events`` directly."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, cast

import aiohttp

from voice_agent.backends.llm.http_client import sse_events


class _Body:
    """What ``sse_events`` reads of a response (its content type and its
    lines), over a body already read."""

    def __init__(self, body: bytes) -> None:
        self.headers = {"Content-Type": "text/event-stream"}
        self.content = _lines(body)


async def _lines(body: bytes) -> AsyncIterator[bytes]:
    """``body`` a line at a time, each with its newline, as aiohttp reads a stream."""
    lines = body.split(b"\n")
    for line in lines[:-1]:
        yield line + b"\n"
    if lines[-1]:
        yield lines[-1]


async def sse_payloads(body: str | bytes) -> list[dict[str, Any]]:
    """The JSON payloads of an event-stream body, up to ``[DONE]``; raises
    ``LlmError`` where the service's client would (invalid JSON, an error
    event)."""
    raw = body.encode() if isinstance(body, str) else body
    response = cast(aiohttp.ClientResponse, _Body(raw))
    return [event async for event in sse_events(response)]
