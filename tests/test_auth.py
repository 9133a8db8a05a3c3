"""Authentication: API keys, single-use client secrets bound to a session,
the LLM proxy behind a key, and limits per key. Real server, real aiortc
callers, fake models (voice_agent/testing/fake_models.py) and the scripted
LLM: no model decides who may call."""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import RunningServer, ServerFactory, serve_refusing_to_start
from voice_agent.client import RealtimeClient
from voice_agent.config import Settings
from voice_agent.server.auth import Authenticator
from voice_agent.testing.ports import free_port

KEY = "sk-test-good-0123456"
OTHER = "sk-other-key-0123456"
CALLS = "/v1/realtime/calls"
SECRETS = "/v1/realtime/client_secrets"


async def mint(
    http: aiohttp.ClientSession, server: RunningServer, body: dict[str, Any], key: str | None = KEY
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with http.post(server.url + SECRETS, json=body, headers=headers) as response:
        return response.status, await response.json()


async def get(
    http: aiohttp.ClientSession, server: RunningServer, path: str, key: str | None
) -> Any:
    """A GET's JSON body; asserts it was answered 200."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with http.get(server.url + path, headers=headers) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def status_of(
    http: aiohttp.ClientSession, method: str, url: str, token: str | None
) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with http.request(method, url, headers=headers) as response:
        return response.status, await response.text()


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
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(auth="required", api_keys=[KEY])
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
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(auth="required", api_keys=[KEY])
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
    # An integer no float can hold (float() of it overflows).
    status, body = await mint(http, server, {"expires_after": {"seconds": 10**400}})
    assert status == 400 and body["error"]["code"] == "invalid_expires_after"
    status, body = await mint(http, server, {"session": "not an object"})
    assert status == 400


async def test_a_secret_refused_for_a_full_server_is_still_good_for_the_retry(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(auth="required", api_keys=[KEY], max_calls=1)
    first = RealtimeClient(server.url, token=KEY)
    await first.connect(http)
    _, body = await mint(http, server, {})
    assert "server_full" in await refused(server, http, body["value"])
    await first.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    retry = RealtimeClient(server.url, token=body["value"])  # as the SDK's reconnect does
    await retry.connect(http)
    await asyncio.wait_for(retry.wait_for_type("session.created"), 10)
    await retry.hangup(http)
    assert "invalid_client_secret" in await refused(server, http, body["value"])


async def test_a_forged_or_altered_secret_is_refused(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(auth="required", api_keys=[KEY, OTHER])
    _, body = await mint(http, server, {"session": {"instructions": "Say banana."}})
    kid, sealed, mac = body["value"][len("ek_") :].split(".")
    _, other = await mint(http, server, {}, OTHER)
    other_kid = other["value"][len("ek_") :].split(".")[0]
    for forged in (
        f"ek_{other_kid}.{sealed}.{mac}",  # claims another key
        f"ek_{kid}.{sealed[:-2]}AA.{mac}",  # another session or expiry
        f"ek_{kid}.{sealed}.{mac[:-2]}AA",  # another signature
        f"ek_{kid}.{sealed}",
        "ek_" + "A" * 40,
    ):
        assert "invalid_client_secret" in await refused(server, http, forged), forged
    assert server.calls.calls_total == 0


async def test_secrets_ice_credentials_and_the_proxy_share_a_rate_per_key(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(
        auth="required", api_keys=[KEY, OTHER], requests_per_minute_per_key=3, enable_llm_proxy=True
    )
    assert (await mint(http, server, {}))[0] == 200
    assert (await mint(http, server, {}))[0] == 200
    assert (await status_of(http, "GET", server.url + "/v1/ice-servers", KEY))[0] == 200
    status, body = await mint(http, server, {})  # the fourth in a minute
    assert status == 429 and body["error"]["code"] == "rate_limited", body
    assert (await status_of(http, "GET", server.url + "/v1/ice-servers", KEY))[0] == 429
    proxied = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with http.post(
        server.url + "/v1/chat/completions", json=proxied, headers=headers
    ) as response:
        assert response.status == 429 and int(response.headers["Retry-After"]) >= 1
    # Another key has its own budget, and calls are not counted against it.
    assert (await mint(http, server, {}, OTHER))[0] == 200
    client = RealtimeClient(server.url, token=KEY)
    await client.connect(http)
    await client.hangup(http)


async def test_the_llm_proxy_needs_a_key(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(auth="required", api_keys=[KEY], enable_llm_proxy=True)
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
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(
        auth="required",
        api_keys=[KEY, OTHER],
        max_calls_per_key=1,
        offers_per_minute_per_key=3,
    )
    first = RealtimeClient(server.url, token=KEY)
    await first.connect(http)
    _, body = await mint(http, server, {})
    assert "too_many_calls" in await refused(server, http, body["value"])  # the key's secret
    other = RealtimeClient(server.url, token=OTHER)  # another key is not limited by it
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
    stats = await get(http, server, "/v1/stats", KEY)
    auth = stats["auth"]
    assert auth["refused"]["too_many_calls"] == 1 and auth["refused"]["rate_limited"] == 1


async def test_auth_is_required_off_loopback_and_serve_says_how() -> None:
    stderr = await serve_refusing_to_start("--host", "0.0.0.0", "--workers", "0")
    assert "API keys are required (listening on 0.0.0.0, not loopback)" in stderr
    assert "--api-keys-file" in stderr


async def test_every_endpoint_but_the_probes_and_the_page_needs_a_key(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(auth="required", api_keys=[KEY])
    for path in ("/v1/stats", "/metrics"):
        for token in (None, "sk-wrong-0123456789", "sk-\u00e9t\u00e9-non-ascii"):
            status, body = await status_of(http, "GET", server.url + path, token)
            assert status == 401 and "internal_error" not in body, (path, token, body)
        assert (await status_of(http, "GET", server.url + path, KEY))[0] == 200
    # The probe says ready or not to anyone, the details (the LLM's URL,
    # its errors, the load) only with a key.
    assert set(await get(http, server, "/readyz", None)) == {"status", "ready"}
    assert "llm" in await get(http, server, "/readyz", KEY)
    for path in (
        "/healthz",
        "/v1/voices",
        "/",
        "/sdk/voice-agent.js",
        "/sdk/voice-agent-events.js",
    ):
        async with http.get(server.url + path) as response:
            assert response.status == 200, path
    # A bearer token beyond ASCII is a wrong key, not a crash.
    assert "invalid_api_key" in await refused(server, http, "sk-\u00e9t\u00e9-non-ascii")


async def test_a_call_is_seen_and_ended_only_by_its_maker(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(auth="required", api_keys=[KEY, OTHER])
    _, body = await mint(http, server, {})
    client = RealtimeClient(server.url, token=body["value"])  # a page with a client secret
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    url = client.call_url
    for method in ("GET", "DELETE"):
        assert (await status_of(http, method, url, None))[0] == 401
        assert (await status_of(http, method, url, "ek_forged"))[0] == 401
        assert (await status_of(http, method, url, OTHER))[0] == 404  # not its maker
    assert len(server.calls) == 1
    assert (await status_of(http, "GET", url, KEY))[0] == 200  # the key that minted
    await client.hangup(http)  # DELETE with the (spent) secret the call was made with
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    assert server.calls.ended.get("hangup") == 1
    # A late second hang-up with that secret: the call is gone, not the caller wrong.
    assert (await status_of(http, "DELETE", url, body["value"]))[0] == 404


async def test_a_scraper_reads_metrics_on_its_own_port_without_a_key(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    port = free_port()
    server = await fake_server_factory(auth="required", api_keys=[KEY], metrics_port=port)
    await web.TCPSite(server.runner, "127.0.0.1", port).start()  # as serve does
    scraper = f"http://127.0.0.1:{port}"
    status, text = await status_of(http, "GET", scraper + "/metrics", None)
    assert status == 200 and "voice_agent_active_calls" in text
    for path in ("/v1/stats", "/readyz", "/"):  # that port serves nothing else
        assert (await status_of(http, "GET", scraper + path, KEY))[0] == 404
    assert (await status_of(http, "GET", server.url + "/metrics", None))[0] == 401


async def test_keys_configured_are_enforced_on_loopback_too(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(api_keys=[KEY])  # --auth auto, 127.0.0.1
    assert "missing_api_key" in await refused(server, http, None)
    assert (await get(http, server, "/v1/stats", KEY))["auth"]["required"] is True


@pytest.mark.parametrize(
    ("key", "why"),
    [("sk-short", "shorter than 16"), ("sk-replace-me-0123456", "placeholder")],
)
async def test_serve_refuses_short_and_placeholder_keys(key: str, why: str) -> None:
    stderr = await serve_refusing_to_start("--auth", "required", "--api-keys", key)
    assert why in stderr and key not in stderr  # the key itself is never logged


def test_keys_from_the_environment_as_a_list_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOICE_AGENT_API_KEYS", f"{KEY}, {OTHER}")
    assert Settings().api_keys == [KEY, OTHER]
    monkeypatch.setenv("VOICE_AGENT_API_KEYS", json.dumps([KEY]))
    assert Settings().api_keys == [KEY]
    monkeypatch.setenv("VOICE_AGENT_CORS_ORIGINS", "https://a.example,https://b.example")
    assert Settings().cors_origins == ["https://a.example", "https://b.example"]


def test_auth_off_on_a_public_address_is_logged_as_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="voice_agent.server.auth"):
        Authenticator.from_settings(Settings(host="0.0.0.0", auth="off"))
        Authenticator.from_settings(Settings(host="127.0.0.1", api_keys=[KEY]))
    levels = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert levels[0][0] == "WARNING" and "public address" in levels[0][1]
    assert levels[1] == ("INFO", "authentication required")


def test_a_call_that_ends_before_its_maker_is_bound_frees_the_keys_slot() -> None:
    """A worker can report a call's end before the front has relayed its
    answer and bound it to its key: the key's slot is still given back."""
    auth = Authenticator([KEY], required=True, max_calls_per_key=1)
    caller = auth.identify({"Authorization": f"Bearer {KEY}"}, allow_secret=False)
    assert caller is not None and auth.claim_call(caller)
    assert not auth.claim_call(caller)  # its one slot is taken
    auth.on_call_change("ended", "rtc_w0_early")
    auth.bind_call("rtc_w0_early", caller)
    assert auth.claim_call(caller)  # given back
    auth.bind_call("rtc_w0_later", caller)
    auth.on_call_change("ended", "rtc_w0_later")  # the usual order still frees it
    assert auth.claim_call(caller)
