"""Closing a client's WebSocket in bounded time, whatever the client does.

aiohttp's ``close()`` sends a close frame, waits for the send buffer to
drain and then for the client's own close frame. A client that stops
reading never drains it, and aiohttp's transport close waits for the same
buffer: the connection, its file descriptor and megabytes of kernel buffer
stay until the client goes, and a handler awaiting the close keeps the
call's slot. So the close gets ``CLOSE_TIMEOUT_S``, and then the
connection is aborted, dropping what the client never read; a client that
closed first gets the same time to read what is on its way to it.
"""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

log = logging.getLogger(__name__)

# A client that reads answers a close frame in a round trip; this leaves
# room for a slow network and none for a client that stopped reading.
CLOSE_TIMEOUT_S = 5.0
# The close code the front gives a media worker's socket when it ends a
# call because its client stopped reading (private use, RFC 6455 7.4.2):
# the worker then records the call's end as slow_client, not hangup.
SLOW_CLIENT_CLOSE_CODE = 4008


async def close_client_websocket(
    ws: web.WebSocketResponse, transport: asyncio.Transport | None
) -> None:
    """Close ``ws`` and let go of its connection (``transport``, taken from
    the request before the upgrade: aiohttp drops its own once closing)."""
    if not ws.prepared:
        return  # never upgraded: an HTTP answer, and aiohttp keeps the connection
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CLOSE_TIMEOUT_S
    try:
        async with asyncio.timeout_at(deadline):
            await ws.close()
    except TimeoutError:
        log.info("websocket client did not take the close; connection aborted")
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            _abort_unless_released(transport)
            raise
        # Nothing was cancelled here: aiohttp's close waited on the drain
        # future of a writer cancelled mid-send (a client that stopped
        # reading), which is left cancelled. The close failed.
    except Exception:  # a connection already reset, say: nothing left to close
        pass
    else:
        # A clean close. A client that closed first may still be reading
        # what was sent before: it gets until the deadline, not for ever.
        if transport is not None and not _released(transport):
            loop.call_later(max(0.0, deadline - loop.time()), _abort_unless_released, transport)
        return
    _abort_unless_released(transport)  # what the client never read goes with it


def _abort_unless_released(transport: asyncio.Transport | None) -> None:
    if transport is not None and not _released(transport):
        transport.abort()


def _released(transport: asyncio.Transport) -> bool:
    return transport.is_closing() and transport.get_write_buffer_size() == 0
