"""The LLM client against the real embedded llama.cpp server (SmolLM2-135M):
streaming, instructions and history reaching the model, instructions set by
session.update over WebRTC, the proxy, and the Responses API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import ServerFactory, run_server
from tests.conftest import test_settings as settings_for
from voice_agent.backends.base import ChatMessage, LlmBackend
from voice_agent.backends.llm.chat_completions import OpenAIChatLlm
from voice_agent.backends.llm.responses import OpenAIResponsesLlm
from voice_agent.client import RealtimeClient
from voice_agent.engine import Engine
from voice_agent.testing.scripted_llm import close_quietly, engine_with_llm
from voice_agent.testing.sse import sse_payloads


def llm_of(engine: Engine) -> LlmBackend:
    assert engine.models is not None
    return engine.models.llm


async def greedy(llm: LlmBackend, messages: list[ChatMessage]) -> tuple[int, str]:
    parts = [p async for p in llm.stream_reply(messages, 16, 0.0)]
    return len(parts), "".join(p for p in parts if isinstance(p, str))


async def test_chat_completions_stream_token_by_token(engine: Engine) -> None:
    deltas, text = await greedy(llm_of(engine), [ChatMessage("user", "Tell me about cats.")])
    assert deltas > 3 and text.strip()


async def test_instructions_and_history_reach_the_model(engine: Engine) -> None:
    """Greedy decoding is deterministic: a different prompt part that changes
    the answer was part of the prompt."""
    llm = llm_of(engine)
    question = ChatMessage("user", "What is your name?")
    _, pirate = await greedy(llm, [ChatMessage("system", "You are a pirate named Jack."), question])
    _, plain = await greedy(llm, [ChatMessage("system", "You are a helpful assistant."), question])
    _, again = await greedy(llm, [ChatMessage("system", "You are a pirate named Jack."), question])
    assert pirate == again and pirate != plain
    history = [ChatMessage("user", "My name is Zoe."), ChatMessage("assistant", "Hi Zoe!")]
    _, with_history = await greedy(llm, [*history, question])
    _, without = await greedy(llm, [question])
    assert with_history != without


async def test_the_embedded_llama_server_serves_the_responses_api_too(engine: Engine) -> None:
    """llama-server speaks both OpenAI APIs: --llm-backend responses works
    with the embedded model, and greedy decoding answers the same words."""
    assert engine.llama is not None and engine.llm_config is not None
    responses = OpenAIResponsesLlm(engine.llm_config)
    question = [ChatMessage("user", "Tell me about cats.")]
    try:
        deltas, text = await greedy(responses, question)
    finally:
        await responses.aclose()
    assert deltas > 3 and text.strip()
    assert text == (await greedy(llm_of(engine), question))[1]


@asynccontextmanager
async def recording_forwarder(upstream: str) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """An HTTP hop in front of the LLM server that keeps every request body:
    what the model was really sent, not what the session believes it holds."""
    bodies: list[dict[str, Any]] = []
    http = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        bodies.append(body)
        async with http.post(upstream + "/chat/completions", json=body) as answer:
            response = web.StreamResponse(
                status=answer.status,
                headers={"Content-Type": answer.headers.get("Content-Type", "")},
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}/v1", bodies
    finally:
        await runner.cleanup()
        await http.close()


@pytest.mark.slow
async def test_session_update_instructions_drive_typed_turns(
    engine: Engine, http: aiohttp.ClientSession
) -> None:
    assert engine.llm_config is not None
    async with recording_forwarder(engine.llm_config.base_url.rstrip("/")) as (url, bodies):
        llm = OpenAIChatLlm(replace(engine.llm_config, base_url=url))
        proxied = engine_with_llm(engine, llm, llm_max_tokens=24, llm_prefill=False)
        async with run_server(settings_for(llm_max_tokens=24), proxied) as server:
            client = RealtimeClient(server.url)
            await client.connect(http)
            client.send(
                {"type": "session.update", "session": {"instructions": "You are a pirate."}}
            )
            await asyncio.wait_for(client.wait_for_type("session.updated"), 5)
            transcripts: list[str] = []
            for question in ("Hello there!", "What do you like?"):
                mark = len(client.events)
                client.send(
                    {
                        "type": "conversation.item.create",
                        "item": {
                            "type": "message",
                            "role": "user",
                            "content": [{"type": "input_text", "text": question}],
                        },
                    }
                )
                asked_at = time.monotonic()
                client.send({"type": "response.create"})
                done = await asyncio.wait_for(client.wait_for_type("response.done", after=mark), 60)
                assert done["response"]["status"] == "completed"
                transcripts.append(done["response"]["output"][0]["content"][0]["transcript"])
                assert transcripts[-1].strip()
                assert client.received.first_sound_after(asked_at) is not None
            await client.hangup(http)
            await asyncio.wait_for(server.calls.wait_for_count(0), 5)
        await close_quietly(llm)
    # What reached the model: the new instructions, then the history so far.
    first, second = bodies
    assert first["messages"] == [
        {"role": "system", "content": "You are a pirate."},
        {"role": "user", "content": "Hello there!"},
    ]
    assert [(m["role"], m["content"]) for m in second["messages"]][0:2] == [
        ("system", "You are a pirate."),
        ("user", "Hello there!"),
    ]
    assert second["messages"][2]["role"] == "assistant"
    assert second["messages"][-1] == {"role": "user", "content": "What do you like?"}


async def test_the_proxy_serves_the_embedded_model(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(enable_llm_proxy=True)
    request = {
        "model": "whatever-the-client-says",
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 8,
        "stream": True,
    }
    async with http.post(server.url + "/v1/chat/completions", json=request) as response:
        assert response.status == 200
        lines = (await response.text()).splitlines()
    chunks = await sse_payloads("\n".join(lines))
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text.strip()
    assert "data: [DONE]" in lines
