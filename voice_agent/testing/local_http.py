"""The HTTP server of a stand-in remote service, for a test or a benchmark,
on a free loopback port."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serve_on_loopback(
    app: web.Application, sock: socket.socket | None = None
) -> AsyncIterator[str]:
    """``app`` served as the service serves its own (a client that hangs up
    cancels its handler), until the block ends; yields its base URL. On a
    free loopback port, or on ``sock`` (one listening elsewhere, e.g. in a
    test's network namespace)."""
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site: web.BaseSite = (
        web.TCPSite(runner, "127.0.0.1", 0) if sock is None else web.SockSite(runner, sock)
    )
    await site.start()
    host, port = site._server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
