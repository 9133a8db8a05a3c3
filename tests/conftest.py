"""Shared fixtures: one real engine (real models, real llama.cpp server) per
test run, and servers built on it with per-test settings."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.server.app import CALLS, build_app
from voice_agent.server.calls import CallRegistry
from voice_agent.testing.ports import free_port
from voice_agent.testing.scripted_llm import ScriptedLlmServer, scripted_llm_server

# The STT tests' fixtures (tiny NeMo model, parakeet backend) live in their own module.
pytest_plugins = ["tests.stt_fixtures"]

# aioice never offers 127.0.0.1 as a candidate; pin both peers to loopback so
# every test call stays on this machine.
LOOPBACK = ["127.0.0.1"]


async def serve_refusing_to_start(*args: str) -> str:
    """Run ``voice-agent serve`` with ``args``, which must stop it at start-up:
    exit code 1 and a message, never a traceback. Returns its stderr."""
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "voice_agent", "serve", "--port", str(free_port())),
        *(*args, "--log-format", "text"),
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    async with asyncio.timeout(120):
        _, stderr = await process.communicate()
    text = stderr.decode()
    assert process.returncode == 1, text
    assert "Traceback" not in text
    return text


def test_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "host": "127.0.0.1",
        "port": 0,
        "ice_host_addresses": LOOPBACK,
        "log_format": "text",
        # Most tests time their speech against the fixed silence; those of
        # semantic turns (the shipped default) ask for it.
        "turn_detection": "silence",
    }
    values.update(overrides)
    return Settings(**values)


@pytest_asyncio.fixture(scope="session")
async def engine() -> AsyncIterator[Engine]:
    engine = Engine(test_settings())
    await engine.start()
    yield engine
    await engine.stop()


class RunningServer:
    def __init__(self, app: web.Application, runner: web.AppRunner, url: str) -> None:
        self.app = app
        self.runner = runner
        self.url = url

    @property
    def calls(self) -> CallRegistry:
        return self.app[CALLS]


ServerFactory = Callable[..., Awaitable[RunningServer]]


@asynccontextmanager
async def run_server(
    settings: Settings, engine: Engine, routes: Sequence[web.RouteDef] = ()
) -> AsyncIterator[RunningServer]:
    """The real app on a free loopback port; ``routes`` adds test-only routes."""
    app = build_app(settings, engine)
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)  # as cli.serve
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield RunningServer(app, runner, f"http://127.0.0.1:{port}")
    finally:
        await runner.cleanup()


@pytest_asyncio.fixture
async def server_factory(engine: Engine) -> AsyncIterator[ServerFactory]:
    stack: list[Any] = []

    async def make(**overrides: Any) -> RunningServer:
        context = run_server(test_settings(**overrides), engine)
        server = await context.__aenter__()
        stack.append(context)
        return server

    yield make
    for context in reversed(stack):
        await context.__aexit__(None, None, None)


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest_asyncio.fixture
async def peer() -> AsyncIterator[ScriptedLlmServer]:
    """A scripted LLM server (voice_agent/testing/scripted_llm.py) for one test."""
    async with scripted_llm_server() as server:
        yield server


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# Markers (pyproject.toml, docs/testing.md) that follow from the fixtures a
# test uses, directly or through others (server_factory, call, parakeet_server
# all need the engine): the engine loads Whisper, Piper, Smart Turn, Silero and
# llama-server, tiny_nemo_model builds a NeMo model, playwright drives
# Chromium. A module that imports the SIP lab (voice_agent/testing) runs it.
# Tests that start a model, a container or a browser themselves carry their
# marker in their module.
MARKERS_BY_FIXTURE = {"engine": "models", "tiny_nemo_model": "models", "playwright": "browser"}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects anything
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        names = {m for f, m in MARKERS_BY_FIXTURE.items() if f in used}
        if hasattr(getattr(item, "module", None), "sip_lab"):
            names.add("sip")
        for name in sorted(names):
            item.add_marker(name)
