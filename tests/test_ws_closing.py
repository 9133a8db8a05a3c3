"""Closing a client's WebSocket in bounded time (voice_agent/ws/closing.py)
without cutting off a client that reads: a real aiohttp server and client."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp
from aiohttp import web

from voice_agent.ws.closing import close_client_websocket


async def test_a_client_that_closes_first_still_gets_a_clean_close() -> None:
    # The server has events on their way to the client (in the transport's
    # buffer) when the client closes: the client reads them and then gets
    # the server's close, 1000, not a connection cut under it (1006).
    buffered_at_close: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        transport = request.transport
        assert transport is not None
        await ws.prepare(request)

        async def burst() -> None:
            with contextlib.suppress(Exception):
                for _ in range(400):
                    await ws.send_str("x" * 20_000)

        sending = asyncio.create_task(burst())
        async for _ in ws:
            pass
        buffered_at_close.append(transport.get_write_buffer_size())
        sending.cancel()
        await close_client_websocket(ws, transport)
        return ws

    app = web.Application()
    app.router.add_get("/", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(f"http://127.0.0.1:{port}/")
            await ws.receive()
            await ws.send_str("bye")
            await ws.close()
            assert ws.close_code == 1000 and ws.exception() is None, ws.exception()
    finally:
        await runner.cleanup()
    assert buffered_at_close and buffered_at_close[0] > 0  # the case this is about
