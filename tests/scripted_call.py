"""A real WebRTC call to a real server whose LLM is a scripted LLM server
(which records every request), and small helpers to talk over it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from tests import conftest
from voice_agent.client import RealtimeClient
from voice_agent.engine import Engine
from voice_agent.testing.scripted_llm import (
    ScriptedLlmServer,
    close_quietly,
    engine_with_llm,
    make_llm,
    scripted_llm_server,
)


@pytest.fixture
async def peer() -> AsyncIterator[ScriptedLlmServer]:
    async with scripted_llm_server() as server:
        yield server


@pytest.fixture
async def call(
    engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> AsyncIterator[RealtimeClient]:
    llm = make_llm("chat-completions", peer.base_url)
    scripted = engine_with_llm(engine, llm, llm_prefill=False)
    async with conftest.run_server(conftest.test_settings(), scripted) as server:
        client = RealtimeClient(server.url)
        await client.connect(http)
        await asyncio.wait_for(client.wait_for_type("session.created"), 10)
        yield client
        await client.hangup(http)
        await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    await close_quietly(llm)


async def ask(client: RealtimeClient, event: dict[str, Any]) -> Any:
    """Send ``event``; the next event the server sends back."""
    mark = len(client.events)
    client.send(event)
    return await asyncio.wait_for(client.wait_for(lambda e: True, after=mark), 5)


async def refused(client: RealtimeClient, event: dict[str, Any]) -> Any:
    """Send ``event`` (with an id); the error it is answered with, whatever
    else is being sent meanwhile."""
    event_id = f"evt_{len(client.events)}_{event['type']}"
    mark = len(client.events)
    client.send({**event, "event_id": event_id})
    error = await asyncio.wait_for(
        client.wait_for(lambda e: e.get("error", {}).get("event_id") == event_id, after=mark), 5
    )
    return error["error"]


async def answered(client: RealtimeClient, response: dict[str, Any] | None = None) -> Any:
    mark = len(client.events)
    client.send({"type": "response.create", **({"response": response} if response else {})})
    done = await asyncio.wait_for(client.wait_for_type("response.done", after=mark), 30)
    return done["response"]


def history(request: dict[str, Any]) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in request["messages"]]
