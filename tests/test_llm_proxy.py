"""The LLM proxy: the server's model and key, streamed pass-through, bounded
bodies, clear errors, and a client that leaves ends the upstream request.
The upstream is the scripted LLM; the engine's STT and TTS are the fakes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import aiohttp
import pytest

from tests import conftest
from voice_agent.backends.llm.http_client import HttpLlmConfig
from voice_agent.engine import Engine
from voice_agent.strict_json import MAX_DEPTH
from voice_agent.testing.ports import free_port
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    engine_with_llm,
    text_events,
)
from voice_agent.testing.sse import sse_payloads

SECRET = "sk-server-secret"


PROMPTS: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": []},
    "/v1/responses": {"input": "hi"},
}


def proxied(engine: Engine, base_url: str) -> Engine:
    assert engine.models is not None
    endpoint = HttpLlmConfig(base_url, SECRET, "server-model", first_token_timeout_s=5)
    return engine_with_llm(engine, engine.models.llm, endpoint)


@pytest.mark.parametrize(
    ("path", "api"),
    [("/v1/chat/completions", "chat-completions"), ("/v1/responses", "responses")],
)
async def test_requests_are_forwarded_with_the_server_s_model_and_key(
    fake_engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession, path: str, api: str
) -> None:
    peer.add(Script(text_events(api, "Hello ", "there.")))
    settings = conftest.test_settings(enable_llm_proxy=True)
    async with (
        conftest.run_server(settings, proxied(fake_engine, peer.base_url)) as server,
        http.post(
            server.url + path,
            json={"model": "client-model", "stream": True, **PROMPTS[path]},
            headers={"Authorization": "Bearer client-token"},
        ) as response,
    ):
        assert response.status == 200
        assert response.content_type == "text/event-stream"
        body = await response.text()
    ((seen_path, request),) = peer.requests
    assert seen_path == path
    assert request["model"] == "server-model"
    assert peer.authorizations == [f"Bearer {SECRET}"]
    assert SECRET not in body
    assert await sse_payloads(body) == text_events(api, "Hello ", "there.")


@pytest.mark.parametrize(
    ("upstream", "status", "code"),
    [(500, 502, "upstream_error"), (401, 502, "upstream_error"), (400, 400, "upstream_refused")],
)
async def test_upstream_errors_reach_the_client_as_a_generic_message(
    fake_engine: Engine,
    peer: ScriptedLlmServer,
    http: aiohttp.ClientSession,
    caplog: pytest.LogCaptureFixture,
    upstream: int,
    status: int,
    code: str,
) -> None:
    # Explicitly: a library loaded earlier in the session (NeMo's stack) can
    # leave pytest's capture handlers above WARNING.
    caplog.set_level(logging.WARNING, logger="voice_agent.server.llm_proxy")
    peer.add(Script(status=upstream))
    settings = conftest.test_settings(enable_llm_proxy=True)
    async with (
        conftest.run_server(settings, proxied(fake_engine, peer.base_url)) as server,
        http.post(server.url + "/v1/chat/completions", json={}) as response,
    ):
        assert response.status == status
        error = (await response.json())["error"]
    assert error["code"] == code and f"answered {upstream}" in error["message"]
    # The provider's words (which can name hosts or quote keys) stay in the log.
    assert "scripted failure" not in error["message"] and peer.url not in error["message"]
    (logged,) = [r for r in caplog.records if r.getMessage() == "llm proxy: upstream refused"]
    assert f"scripted failure {upstream}" in logged.__dict__["body"]


async def test_bad_bodies_and_a_dead_endpoint_get_clear_errors(
    fake_engine: Engine, http: aiohttp.ClientSession
) -> None:
    dead = proxied(fake_engine, f"http://127.0.0.1:{free_port()}/v1")
    settings = conftest.test_settings(enable_llm_proxy=True, llm_proxy_max_body_bytes=2048)
    async with conftest.run_server(settings, dead) as server:
        url = server.url + "/v1/chat/completions"
        async with http.post(url, json={"messages": "x" * 5000}) as response:
            assert response.status == 413
            assert (await response.json())["error"]["code"] == "body_too_large"
        async with http.post(url, data=b"{not json") as response:
            assert response.status == 400
            assert (await response.json())["error"]["code"] == "invalid_body"
        async with http.post(url, json=[1]) as response:
            assert response.status == 400
        async with http.post(url, json={"messages": []}) as response:
            assert response.status == 502
            assert (await response.json())["error"]["code"] == "upstream_unreachable"


async def test_a_client_that_leaves_ends_the_upstream_request(
    fake_engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    words = [f"word{i} " for i in range(200)]
    # A model still generating: a token every 50 ms for 10 s.
    peer.add(Script(text_events("chat-completions", "One, ", *words), interval_s=0.05))
    settings = conftest.test_settings(enable_llm_proxy=True)
    async with conftest.run_server(settings, proxied(fake_engine, peer.base_url)) as server:
        response = await http.post(server.url + "/v1/chat/completions", json={"stream": True})
        assert b"One, " in await response.content.readuntil(b"One, ")
        response.close()
        # The proxy's next write fails, and it hangs up on the model.
        await asyncio.wait_for(peer.disconnected.wait(), 5)


async def test_a_client_that_leaves_before_the_first_byte_ends_the_upstream_request(
    fake_engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    """A non-streamed request (or a slow first token): nothing is written that
    could fail, so leaving must be noticed by itself."""
    peer.add(Script(hang_before=True))
    settings = conftest.test_settings(enable_llm_proxy=True)
    async with conftest.run_server(settings, proxied(fake_engine, peer.base_url)) as server:
        request = asyncio.ensure_future(
            http.post(server.url + "/v1/chat/completions", json={"stream": False})
        )
        await asyncio.wait_for(peer.arrived.wait(), 5)
        request.cancel()  # the client gives up and closes its connection
        with contextlib.suppress(asyncio.CancelledError):
            await request
        await asyncio.wait_for(peer.disconnected.wait(), 5)


async def test_the_proxy_is_off_by_default(
    fake_server_factory: conftest.ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    async with http.post(server.url + "/v1/chat/completions", json={}) as response:
        assert response.status in (404, 405)


async def test_json_nested_past_the_limit_is_refused_at_any_depth(
    fake_engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    """Python's parser takes JSON nested about 990 deep, but writing it out
    again, further down the stack, on its way to the model, fails for a band
    of depths just under that (a 500 before the limit existed)."""
    settings = conftest.test_settings(enable_llm_proxy=True)
    async with conftest.run_server(settings, proxied(fake_engine, peer.base_url)) as server:
        url = server.url + "/v1/chat/completions"
        for depth in (MAX_DEPTH + 1, 500, *range(900, 1000, 2), 5000):
            body = '{"messages": [], "tools": ' + "[" * depth + "]" * depth + "}"
            async with http.post(url, data=body) as response:
                assert response.status == 400, depth
                error = (await response.json())["error"]
                assert error["code"] == "invalid_body" and "nested" in error["message"]
            async with http.post(url, data=b'{"temperature": NaN}') as response:
                assert response.status == 400
        assert peer.requests == []
        peer.add(Script(text_events("chat-completions", "Deep enough.")))
        body = '{"messages": [], "tools": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}"
        async with http.post(url, data=body) as response:
            assert response.status == 200 and "Deep enough." in await response.text()


async def test_bodies_are_held_to_the_operators_limits(
    fake_engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    settings = conftest.test_settings(enable_llm_proxy=True, llm_proxy_max_tokens=50)
    async with conftest.run_server(settings, proxied(fake_engine, peer.base_url)) as server:
        chat = server.url + "/v1/chat/completions"
        # Fields past what a side task needs are refused by name, never sent on.
        for extra in ({"id_slot": 0}, {"grammar": "root ::= x"}, {"n": 8}, {"input": "hi"}):
            async with http.post(chat, json={"messages": [], **extra}) as response:
                assert response.status == 400
                error = (await response.json())["error"]
                assert error["code"] == "invalid_body" and next(iter(extra)) in error["message"]
        assert peer.requests == []
        # The ceiling: lowered when asked for more, set when not asked for.
        for asked, path in (({"max_tokens": 4096}, chat), ({"reasoning_effort": "low"}, chat)):
            peer.add(Script(text_events("chat-completions", "Hi.")))
            async with http.post(path, json={"messages": [], **asked}) as response:
                assert response.status == 200
        peer.add(Script(text_events("responses", "Hi.")))
        async with http.post(
            server.url + "/v1/responses", json={"input": "hi", "max_output_tokens": 900}
        ) as response:
            assert response.status == 200
    sent = [request for _, request in peer.requests]
    assert [r.get("max_tokens") for r in sent[:2]] == [50, 50]
    assert sent[2]["max_output_tokens"] == 50


async def test_requests_beyond_the_concurrency_cap_are_refused_at_once(
    fake_engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    """Side tasks must not take every slot the live calls' replies need."""
    settings = conftest.test_settings(enable_llm_proxy=True, llm_proxy_max_concurrent=2)
    peer.add(Script(hang_before=True), Script(hang_before=True))
    async with conftest.run_server(settings, proxied(fake_engine, peer.base_url)) as server:
        url = server.url + "/v1/chat/completions"
        held = [asyncio.ensure_future(http.post(url, json={"messages": []})) for _ in range(2)]
        async with asyncio.timeout(5):
            while len(peer.requests) < 2:  # both upstream: the slots are taken
                await peer.arrived.wait()
                peer.arrived.clear()
        async with http.post(url, json={"messages": []}) as response:
            assert response.status == 429 and response.headers["Retry-After"]
            assert (await response.json())["error"]["code"] == "too_many_requests"
        for request in held:
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await request
        await asyncio.wait_for(peer.wait_for_disconnects(2), 5)
        peer.add(Script(text_events("chat-completions", "Free again.")))
        async with http.post(url, json={"messages": []}) as response:
            assert response.status == 200  # the slots came back
