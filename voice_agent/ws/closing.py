"""Closing a client's WebSocket in bounded time, whatever the client does.

aiohttp's ``close()`` sends a close frame, waits for the send buffer to
drain and then for the client's own close frame. A client that stops
reading never drains it, and aiohttp's transport close waits for the same
buffer: the connection, its file descriptor and megabytes of kernel buffer
stay until the client goes, and a handler awaiting the close keeps the
call's slot. So the close gets ``CLOSE_TIMEOUT_S``, and then the
connection is aborted, dropping what the client never read.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

log = logging.getLogger(__name__)

# A client that reads answers a close frame in a round trip; this leaves
# room for a slow network and none for a client that stopped reading.
CLOSE_TIMEOUT_S = 5.0


async def close_client_websocket(
    ws: web.WebSocketResponse, transport: asyncio.Transport | None
) -> None:
    """Close ``ws`` and let go of its connection (``transport``, taken from
    the request before the upgrade: aiohttp drops its own once closing)."""
    try:
        async with asyncio.timeout(CLOSE_TIMEOUT_S):
            await ws.close()
    except TimeoutError:
        log.info("websocket client did not take the close; connection aborted")
    finally:
        # After a clean close the transport is closed already and this does
        # nothing; otherwise it still holds what the client never read.
        if transport is not None and not _released(transport):
            transport.abort()


def _released(transport: asyncio.Transport) -> bool:
    return transport.is_closing() and transport.get_write_buffer_size() == 0
