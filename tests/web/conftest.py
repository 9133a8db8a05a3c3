"""Fixtures for the browser tests: one Playwright driver per run, and small
real HTTP servers standing in for a customer's site on another origin."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Protocol

import pytest_asyncio
from aiohttp import web
from playwright.async_api import Playwright, async_playwright


@pytest_asyncio.fixture(scope="session")
async def playwright() -> AsyncIterator[Playwright]:
    async with async_playwright() as driver:
        yield driver


class SiteFactory(Protocol):
    def __call__(self, html: str, files: Mapping[str, Path] | None = None) -> Awaitable[str]: ...


@pytest_asyncio.fixture
async def site_factory() -> AsyncIterator[SiteFactory]:
    """``await make(html)`` serves ``html`` at ``/`` on a new port and returns
    the site's origin as ``http://localhost:PORT`` (a different origin from the
    voice service on 127.0.0.1, and still a secure context for the microphone).
    ``files`` maps more paths on the site to files served from disk."""
    runners: list[web.AppRunner] = []

    async def make(html: str, files: Mapping[str, Path] | None = None) -> str:
        async def page(request: web.Request) -> web.Response:
            return web.Response(text=html, content_type="text/html")

        app = web.Application()
        app.router.add_get("/", page)
        for route, path in (files or {}).items():
            app.router.add_get(route, _file_handler(path))
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://localhost:{port}"

    yield make
    for runner in runners:
        await runner.cleanup()


def _file_handler(path: Path) -> Callable[[web.Request], Awaitable[web.FileResponse]]:
    async def serve(request: web.Request) -> web.FileResponse:
        return web.FileResponse(path)

    return serve
