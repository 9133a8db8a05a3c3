"""Frames relayed both ways between a client's WebSocket and a media
worker's, for a WebSocket call the front hands to a worker.

Each direction is a task of its own. Toward the client, what the worker
sends is read at once into an outbox bounded in bytes, and a writer sends
it on. A relay that awaited each send to the client in the task reading
the worker would stop reading the worker as soon as the client stopped
reading: the worker's close would go unseen, and the worker's own bound
(its outbox, which drains into the socket to the front) would never fill.
Here a client that stops reading fills the front's outbox, and the relay
ends as a slow client. When the worker ends the call, what is queued for
the client goes out for up to a second, as from the worker itself.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Literal

import aiohttp
from aiohttp import web

from voice_agent.realtime.protocol import MAX_UNSENT_EVENT_BYTES

# How the relay ended: the client went, the worker ended the call, or the
# client stopped reading.
RelayEnd = Literal["client_gone", "call_ended", "slow_client"]

# The last events of a call the worker ended, for a client still reading.
FLUSH_TIMEOUT_S = 1.0

_FRAMES = (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY)


async def _send(
    ws: web.WebSocketResponse | aiohttp.ClientWebSocketResponse, data: str | bytes
) -> None:
    if isinstance(data, str):
        await ws.send_str(data)
    else:
        await ws.send_bytes(data)


async def relay_frames(
    client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse
) -> RelayEnd:
    """Relay until one side ends or the client falls behind; the caller
    closes both sockets."""
    outbox: asyncio.Queue[str | bytes | None] = asyncio.Queue()
    queued = 0  # bytes in the outbox

    async def from_client() -> None:
        async for message in client:
            if message.type not in _FRAMES:
                return
            await _send(upstream, message.data)

    async def from_worker() -> RelayEnd:
        nonlocal queued
        try:
            async for message in upstream:
                if message.type not in _FRAMES:
                    break
                if queued + len(message.data) > MAX_UNSENT_EVENT_BYTES:
                    return "slow_client"
                queued += len(message.data)
                outbox.put_nowait(message.data)
        finally:
            outbox.put_nowait(None)  # the writer sends what is queued, then stops
        return "call_ended"

    async def to_client() -> None:
        nonlocal queued
        while (data := await outbox.get()) is not None:
            queued -= len(data)
            await _send(client, data)

    reading_client = asyncio.create_task(from_client(), name="ws-relay-from-client")
    reading_worker = asyncio.create_task(from_worker(), name="ws-relay-from-worker")
    writing = asyncio.create_task(to_client(), name="ws-relay-to-client")
    tasks: tuple[asyncio.Task[Any], ...] = (reading_client, reading_worker, writing)
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        if reading_worker not in done:
            return "client_gone"  # it closed, or a send to it failed
        ended: RelayEnd = "call_ended"
        if reading_worker.exception() is None:
            ended = reading_worker.result()
        if ended == "call_ended":
            await asyncio.wait((writing,), timeout=FLUSH_TIMEOUT_S)
        return ended
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
