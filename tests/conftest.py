"""Shared fixtures: one real engine (real models, real llama.cpp server) per
test run, one with fake models (``fake_engine``) for what the models do not
decide, and servers built on either with per-test settings."""

from __future__ import annotations

import asyncio
import json
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
from voice_agent.server.app import CALLS
from voice_agent.server.calls import CallRegistry
from voice_agent.server.in_process_app import build_app
from voice_agent.testing import fake_models
from voice_agent.testing.ports import free_port
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    chat_text,
    responses_text,
    scripted_llm_server,
)

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
        # A fixed capacity: no turn's cost measured at each engine's start
        # (tests/test_capacity.py measures it), and room for the tests' callers.
        "max_calls": 50,
    }
    values.update(overrides)
    return Settings(**values)


@pytest_asyncio.fixture(scope="session")
async def engine() -> AsyncIterator[Engine]:
    engine = Engine(test_settings())
    await engine.start()
    yield engine
    await engine.stop()


# What the fake engine's LLM says when a test queued nothing else.
FAKE_REPLY = "This is a fake reply."


def fake_reply(server: ScriptedLlmServer) -> Callable[[dict[str, Any]], Script | None]:
    """The scripted server's answer when its queue is empty: ``FAKE_REPLY``,
    streamed or whole as asked, in the API the body speaks (Responses has
    ``input``, Chat Completions ``messages``)."""

    def answer(body: dict[str, Any]) -> Script | None:
        if server.scripts:
            return None  # what a test queued comes first
        responses = "input" in body and "messages" not in body
        if body.get("stream", False):
            return Script(responses_text(FAKE_REPLY) if responses else chat_text(FAKE_REPLY))
        message = {"role": "assistant", "content": FAKE_REPLY}
        text = {"type": "output_text", "text": FAKE_REPLY}
        item = {"type": "message", "id": "msg_1", "role": "assistant", "content": [text]}
        whole = (
            {"id": "resp_1", "object": "response", "status": "completed", "output": [item]}
            if responses
            else {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": "scripted",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
        )
        return Script(raw=json.dumps(whole).encode(), content_type="application/json")

    return answer


@pytest_asyncio.fixture(scope="session")
async def fake_llm() -> AsyncIterator[ScriptedLlmServer]:
    """The fake engine's LLM: a scripted server (shared by every test that
    uses the fake engine) that answers ``FAKE_REPLY`` unless a test queued
    another script. A test that inspects requests uses ``peer`` instead."""
    async with scripted_llm_server() as server:
        server.script_for = fake_reply(server)
        yield server


def fake_settings(llm: ScriptedLlmServer, **overrides: Any) -> Settings:
    """An engine's settings with fake models (voice_agent/testing/fake_models.py)
    and no model anywhere: webrtcvad (a GMM), the silence's turns, and the
    scripted LLM as a remote endpoint, so no llama-server is started."""
    values: dict[str, Any] = {
        "stt": "fake",
        "tts": "fake",
        "vad": "webrtc",
        "turn_backend": "silence",
        "llm_base_url": llm.base_url,
        "llm_model": "scripted-model",
        **overrides,
    }
    return test_settings(**values)


@pytest_asyncio.fixture(scope="session")
async def fake_engine(fake_llm: ScriptedLlmServer) -> AsyncIterator[Engine]:
    """The real engine over fake STT and TTS and the scripted LLM: loads in
    milliseconds, for the tests of signaling, the protocol, HTTP, auth and
    limits, whose outcome no model decides."""
    engine = Engine(fake_settings(fake_llm))
    await engine.start()
    assert engine.models is not None and engine.llama is None  # an endpoint: no llama-server
    assert isinstance(engine.models.stt, fake_models.FakeStt)
    assert isinstance(engine.models.tts, fake_models.FakeTts)
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


@asynccontextmanager
async def servers_over(engine: Engine) -> AsyncIterator[ServerFactory]:
    """Makes servers over ``engine`` with per-test settings; stops them after."""
    stack: list[Any] = []

    async def make(**overrides: Any) -> RunningServer:
        context = run_server(test_settings(**overrides), engine)
        server = await context.__aenter__()
        stack.append(context)
        return server

    try:
        yield make
    finally:
        for context in reversed(stack):
            await context.__aexit__(None, None, None)


@pytest_asyncio.fixture
async def server_factory(engine: Engine) -> AsyncIterator[ServerFactory]:
    async with servers_over(engine) as make:
        yield make


@pytest_asyncio.fixture
async def fake_server_factory(fake_engine: Engine) -> AsyncIterator[ServerFactory]:
    """``server_factory`` over the fake engine: the real app, fake models."""
    async with servers_over(fake_engine) as make:
        yield make


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
# Chromium; fake_engine (and fake_server_factory) loads no model, so marks
# nothing. A module that imports the SIP lab (voice_agent/testing) runs it.
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
