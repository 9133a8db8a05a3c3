"""A real HTTP peer for LLM tests and benchmarks: a local aiohttp server
that speaks the OpenAI streaming wire format (``/v1/chat/completions`` and
``/v1/responses``) from scripted replies, records every request body, and
observes clients that go away (its handler is cancelled when they do)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import socket
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from aiohttp import web

from voice_agent.backends.llm.chat_completions import OpenAIChatLlm
from voice_agent.backends.llm.http_client import HttpLlmConfig
from voice_agent.backends.llm.responses import OpenAIResponsesLlm
from voice_agent.engine import Engine
from voice_agent.testing.local_http import serve_on_loopback

Json = dict[str, Any]


@dataclass
class Script:
    """One reply: an HTTP status, then SSE events; optionally a hang or a drop."""

    events: list[Json] = field(default_factory=list)
    status: int = 200
    hang_before: bool = False  # never answer at all
    hang_after: int | None = None  # keep the stream open after this many events
    drop_after: int | None = None  # cut the TCP connection after this many events
    done: bool = True  # end with ``data: [DONE]``
    interval_s: float = 0.0  # pause between events, as a model generating tokens
    raw: bytes | None = None  # a body sent verbatim instead of the events
    content_type: str = "text/event-stream"


class ScriptedLlmServer:
    def __init__(self) -> None:
        self.scripts: deque[Script] = deque()
        self.requests: list[tuple[str, Json]] = []
        self.authorizations: list[str | None] = []
        self.disconnects = 0
        self.disconnected = asyncio.Event()
        self.arrived = asyncio.Event()  # a request came in
        self._disconnect_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self.url = ""
        # Answers chosen by the request's body (when it gives one), before the queue.
        self.script_for: Callable[[Json], Script | None] | None = None

    def wait_for_disconnects(self, count: int) -> asyncio.Future[None]:
        """Resolves once ``count`` clients in all have hung up mid-request."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.disconnects >= count:
            future.set_result(None)
        else:
            self._disconnect_waiters.append((count, future))
        return future

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def add(self, *scripts: Script) -> None:
        self.scripts.extend(scripts)

    def bodies(self) -> list[Json]:
        return [body for _, body in self.requests]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append((request.path, body))
        self.authorizations.append(request.headers.get("Authorization"))
        self.arrived.set()
        script = self.script_for(body) if self.script_for is not None else None
        if script is None:
            script = self.scripts.popleft() if self.scripts else Script(status=503)
        try:
            return await self._answer_with(request, script)
        except asyncio.CancelledError:
            # aiohttp cancels the handler when the client closes the connection.
            self.disconnects += 1
            self.disconnected.set()
            for count, future in list(self._disconnect_waiters):
                if self.disconnects >= count and not future.done():
                    future.set_result(None)
            raise

    async def _answer_with(self, request: web.Request, script: Script) -> web.StreamResponse:
        if script.hang_before:
            await asyncio.Event().wait()
        if script.status != 200:
            body = {"error": {"message": f"scripted failure {script.status}", "type": "x"}}
            return web.json_response(body, status=script.status)
        response = web.StreamResponse(headers={"Content-Type": script.content_type})
        await response.prepare(request)
        if script.raw is not None:
            await response.write(script.raw)
            await response.write_eof()
            return response
        for index, event in enumerate(script.events):
            if index == script.drop_after:
                assert request.transport is not None
                request.transport.abort()
                return response
            if index == script.hang_after:
                await asyncio.Event().wait()
            if index and script.interval_s:
                await asyncio.sleep(script.interval_s)
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
        if script.hang_after is not None and script.hang_after >= len(script.events):
            await asyncio.Event().wait()
        if script.done:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


@asynccontextmanager
async def scripted_llm_server(
    sock: socket.socket | None = None,
) -> AsyncIterator[ScriptedLlmServer]:
    """On a free loopback port, or on ``sock`` (one listening elsewhere,
    e.g. in a test's network namespace)."""
    server = ScriptedLlmServer()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", server._handle)
    app.router.add_post("/v1/responses", server._handle)
    async with serve_on_loopback(app, sock) as url:
        server.url = url
        yield server


# -- Chat Completions chunks ---------------------------------------------------
def chat_chunk(delta: Json, finish: str | None = None) -> Json:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "model": "scripted",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def chat_text(*pieces: str) -> list[Json]:
    events = [chat_chunk({"role": "assistant", "content": ""})]
    events += [chat_chunk({"content": piece}) for piece in pieces]
    return [*events, chat_chunk({}, "stop")]


def chat_call_fragment(
    index: int, call_id: str | None = None, name: str | None = None, arguments: str = ""
) -> Json:
    fragment: Json = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        fragment.update(id=call_id, type="function")
        fragment["function"]["name"] = name
    return chat_chunk({"tool_calls": [fragment]})


def chat_calls(*calls: tuple[str, str, str]) -> list[Json]:
    """Calls (id, name, arguments) announced first, then their arguments
    interleaved in three-character fragments, as parallel calls stream."""
    events = [chat_call_fragment(i, cid, name) for i, (cid, name, _) in enumerate(calls)]
    longest = max(len(args) for _, _, args in calls)
    for start in range(0, longest, 3):
        for i, (_, _, args) in enumerate(calls):
            if args[start : start + 3]:
                events.append(chat_call_fragment(i, arguments=args[start : start + 3]))
    return [*events, chat_chunk({}, "tool_calls")]


# -- Responses events ------------------------------------------------------------
def responses_text(*pieces: str) -> list[Json]:
    events: list[Json] = [
        {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}},
        {
            "type": "response.output_item.added",
            "output_index": 0,
            "item": {"id": "msg_1", "type": "message", "role": "assistant", "content": []},
        },
    ]
    events += [
        {"type": "response.output_text.delta", "item_id": "msg_1", "delta": piece}
        for piece in pieces
    ]
    return [*events, {"type": "response.completed", "response": {"id": "resp_1"}}]


def responses_calls(*calls: tuple[str, str, str]) -> list[Json]:
    events: list[Json] = []
    for i, (call_id, name, _) in enumerate(calls):
        item = {"id": f"fc_{i}", "type": "function_call", "call_id": call_id, "name": name}
        events.append({"type": "response.output_item.added", "output_index": i, "item": {**item}})
    longest = max(len(args) for _, _, args in calls)
    for start in range(0, longest, 3):
        for i, (_, _, args) in enumerate(calls):
            if args[start : start + 3]:
                events.append(
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": f"fc_{i}",
                        "output_index": i,
                        "delta": args[start : start + 3],
                    }
                )
    for i, (call_id, name, args) in enumerate(calls):
        item = {
            "id": f"fc_{i}",
            "type": "function_call",
            "call_id": call_id,
            "name": name,
            "arguments": args,
        }
        events.append({"type": "response.output_item.done", "output_index": i, "item": item})
    return [*events, {"type": "response.completed", "response": {"id": "resp_1"}}]


API_PATHS = {"chat-completions": "/v1/chat/completions", "responses": "/v1/responses"}


def text_events(api: str, *pieces: str) -> list[Json]:
    return chat_text(*pieces) if api == "chat-completions" else responses_text(*pieces)


def call_events(api: str, *calls: tuple[str, str, str]) -> list[Json]:
    return chat_calls(*calls) if api == "chat-completions" else responses_calls(*calls)


def make_llm(api: str, base_url: str, **config: Any) -> OpenAIChatLlm | OpenAIResponsesLlm:
    values: Json = {
        "connect_timeout_s": 2.0,
        "first_token_timeout_s": 2.0,
        "read_timeout_s": 2.0,
        "retries": 1,
        "backoff_s": 0.05,
        **config,
    }
    cfg = HttpLlmConfig(base_url, None, "scripted-model", **values)
    return OpenAIChatLlm(cfg) if api == "chat-completions" else OpenAIResponsesLlm(cfg)


def engine_with_llm(
    engine: Engine, llm: Any, endpoint: HttpLlmConfig | None = None, **settings: Any
) -> Engine:
    """The shared engine's STT/TTS/VAD with another LLM (and the endpoint
    the proxy forwards to) and settings, for a test server."""
    assert engine.models is not None
    clone = copy.copy(engine)
    clone.settings = engine.settings.model_copy(update=settings)
    clone.models = replace(engine.models, llm=llm)
    clone.llm_config = endpoint
    return clone


async def close_quietly(llm: Any) -> None:
    with contextlib.suppress(Exception):
        await llm.aclose()
