"""Authentication: API keys, single-use client secrets bound to a session,
the LLM proxy behind a key, and limits per key. Real server, real aiortc
callers, real models."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.conftest import RunningServer, ServerFactory, serve_refusing_to_start
from voice_agent.client import RealtimeClient

KEY = "sk-test-good"
CALLS = "/v1/realtime/calls"
SECRETS = "/v1/realtime/client_secrets"


async def mint(
    http: aiohttp.ClientSession, server: RunningServer, body: dict[str, Any], key: str | None = KEY
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with http.post(server.url + SECRETS, json=body, headers=headers) as response:
        return response.status, await response.json()


async def refused(server: RunningServer, http: aiohttp.ClientSession, token: str | None) -> Any:
    """The error an offer with this token gets (it must be refused)."""
    client = RealtimeClient(server.url, token=token)
    try:
        with pytest.raises(RuntimeError) as caught:
            await client.connect(http)
    finally:
        await client.hangup()
    return str(caught.value)


async def test_offers_need_a_valid_key_and_none_leaves_a_call_behind(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(auth="required", api_keys=[KEY])
    assert "401" in await refused(server, http, None)
    assert "missing_api_key" in await refused(server, http, None)
    assert "invalid_api_key" in await refused(server, http, "sk-wrong")
    assert len(server.calls) == 0 and server.calls.calls_total == 0
    client = RealtimeClient(server.url, token=KEY)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    # Health and readiness stay open to probes.
    async with http.get(server.url + "/readyz") as response:
        assert response.status == 200


async def test_a_client_secret_is_bound_to_its_session_single_use_and_expires(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(auth="required", api_keys=[KEY])
    status, body = await mint(http, server, {"session": {"instructions": "Say banana."}}, None)
    assert status == 401 and body["error"]["code"] == "missing_api_key"
    status, body = await mint(http, server, {"session": {"instructions": "Say banana."}})
    assert status == 200 and body["value"].startswith("ek_") and body["expires_at"] > 0
    secret = body["value"]

    client = RealtimeClient(server.url, token=secret)
    await client.connect(http)
    created = await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    assert created["session"]["instructions"] == "Say banana."  # the bound configuration
    assert "invalid_client_secret" in await refused(server, http, secret)  # used once
    await client.hangup(http)

    status, body = await mint(http, server, {"expires_after": {"seconds": 1}})
    assert status == 200
    await asyncio.sleep(1.2)  # the secret's lifetime runs out
    assert "invalid_client_secret" in await refused(server, http, body["value"])
    status, body = await mint(http, server, {"expires_after": {"seconds": 99999}})
    assert status == 400 and body["error"]["code"] == "invalid_expires_after"
    status, body = await mint(http, server, {"session": "not an object"})
    assert status == 400


async def test_the_llm_proxy_needs_a_key(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(auth="required", api_keys=[KEY], enable_llm_proxy=True)
    request = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    async with http.post(server.url + "/v1/chat/completions", json=request) as response:
        assert response.status == 401
        assert (await response.json())["error"]["code"] == "missing_api_key"
    headers = {"Authorization": f"Bearer {KEY}"}
    async with http.post(
        server.url + "/v1/chat/completions", json=request, headers=headers
    ) as response:
        assert response.status == 200
        assert (await response.json())["choices"][0]["message"]["content"]


async def test_limits_per_key_count_its_secrets_and_free_up_when_calls_end(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(
        auth="required",
        api_keys=[KEY, "sk-other"],
        max_calls_per_key=1,
        offers_per_minute_per_key=3,
    )
    first = RealtimeClient(server.url, token=KEY)
    await first.connect(http)
    _, body = await mint(http, server, {})
    assert "too_many_calls" in await refused(server, http, body["value"])  # the key's secret
    other = RealtimeClient(server.url, token="sk-other")  # another key is not limited by it
    await other.connect(http)
    await first.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(1), 5)
    again = RealtimeClient(server.url, token=KEY)
    await again.connect(http)  # the slot came back with the hang-up
    await again.hangup(http)
    await other.hangup(http)
    # Offers per minute: the key has spent its 3 (the secret's included).
    message = await refused(server, http, KEY)
    assert "429" in message and "rate_limited" in message
    async with http.get(server.url + "/v1/stats") as response:
        auth = (await response.json())["auth"]
    assert auth["refused"]["too_many_calls"] == 1 and auth["refused"]["rate_limited"] == 1


async def test_auth_is_required_off_loopback_and_serve_says_how() -> None:
    stderr = await serve_refusing_to_start("--host", "0.0.0.0", "--workers", "1")
    assert "API keys are required (listening on 0.0.0.0, not loopback)" in stderr
    assert "--api-keys-file" in stderr
