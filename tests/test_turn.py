"""Short-lived TURN credentials (voice_agent/rtc/turn.py, GET /v1/ice-servers)
against a real coturn on loopback: what the service mints is what coturn
accepts, and a real aiortc caller restricted to relay candidates completes a
spoken turn through it."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import aioice.turn
import numpy as np
import pytest
import pytest_asyncio
from pydantic import ValidationError

from tests.conftest import ServerFactory
from tests.conftest import test_settings as settings_with
from tests.turn_server import TurnServer, coturn
from voice_agent.client import RealtimeClient, fetch_ice_servers
from voice_agent.rtc.call import Call
from voice_agent.rtc.turn import TURN_USERS_PER_NAME, mint
from voice_agent.testing.audio_data import librivox, silence

KEY = "sk-turn-test-0123456"


@pytest_asyncio.fixture
async def turn() -> AsyncIterator[TurnServer]:
    async with coturn() as server:
        yield server


class _Ignore(asyncio.DatagramProtocol):
    pass


async def allocate(turn: TurnServer, username: str, password: str) -> tuple[str, int]:
    """A real TURN allocation (aioice's client): the relayed address."""
    transport, _ = await asyncio.wait_for(
        aioice.turn.create_turn_endpoint(
            _Ignore, ("127.0.0.1", turn.port), username=username, password=password
        ),
        10,
    )
    try:
        address: tuple[str, int] = transport.get_extra_info("sockname")
        return address
    finally:
        transport.close()


async def test_coturn_accepts_a_minted_credential_and_refuses_a_forged_or_expired_one(
    turn: TurnServer,
) -> None:
    good = mint(turn.secret, "key_abc", ttl_s=600)
    assert re.fullmatch(rf"{good.expires_at}:key_abc\.[0-9a-f]{{8}}", good.username)
    assert mint(turn.secret, "key_abc", ttl_s=600).username != good.username
    assert abs(good.expires_at - (time.time() + 600)) <= 2
    host, port = await allocate(turn, good.username, good.credential)
    assert host == "127.0.0.1" and port > 0

    forged = mint("not-the-secret", "key_abc", ttl_s=600)
    with pytest.raises((ConnectionError, aioice.stun.TransactionFailed)):
        await allocate(turn, forged.username, forged.credential)
    expired = mint(turn.secret, "key_abc", ttl_s=-5)
    with pytest.raises((ConnectionError, aioice.stun.TransactionFailed)):
        await allocate(turn, expired.username, expired.credential)
    # A name cannot smuggle a second expiry or separator into the username.
    odd = mint(turn.secret, "a:b c/9999999999", ttl_s=600)
    assert odd.username.count(":") == 1
    await allocate(turn, odd.username, odd.credential)


def test_turn_settings_that_cannot_work_are_refused() -> None:
    with pytest.raises(ValidationError, match="needs --turn-secret"):
        settings_with(turn_urls=["turn:127.0.0.1:3478"])
    with pytest.raises(ValidationError, match="needs --turn-urls") as no_urls:
        settings_with(turn_secret="the-turn-secret")
    with pytest.raises(ValidationError, match="would expire") as too_short:
        settings_with(turn_secret="the-turn-secret", turn_urls=["turn:h:3478"], turn_ttl_s=600)
    # A refusal is printed at start-up: it never carries the secret.
    assert "the-turn-secret" not in f"{no_urls.value}{too_short.value}"
    for weak in ("tiny-secret", "replace-me-with-openssl-rand-hex-32"):  # deploy/'s example
        with pytest.raises(ValidationError, match=r"shorter than 16|placeholder") as refused:
            settings_with(turn_secret=weak, turn_urls=["turn:h:3478"])
        assert weak not in str(refused.value)
    settings = settings_with(turn_secret="s" * 16, turn_urls="turn:a:3478,turn:b:3478")
    assert settings.turn_urls == ["turn:a:3478", "turn:b:3478"]


async def test_ice_servers_need_a_key_and_carry_fresh_turn_credentials(
    server_factory: ServerFactory, http: aiohttp.ClientSession, turn: TurnServer
) -> None:
    server = await server_factory(
        auth="required",
        api_keys=[KEY],
        ice_servers=["stun:stun.example.test:3478"],
        ice_username="server-only",
        ice_credential="server-only-credential",
        turn_secret=turn.secret,
        turn_urls=[turn.url],
    )
    async with http.get(server.url + "/v1/ice-servers") as refused:
        assert refused.status == 401
        assert (await refused.json())["error"]["code"] == "missing_api_key"
    headers = {"Authorization": f"Bearer {KEY}"}
    async with http.get(server.url + "/v1/ice-servers", headers=headers) as answer:
        assert answer.status == 200
        assert answer.headers["Cache-Control"] == "no-store"
        body: dict[str, Any] = await answer.json()
    stun, relay = body["ice_servers"]
    # STUN is handed on; the server's own static TURN credential never is.
    assert stun == {"urls": ["stun:stun.example.test:3478"]}
    assert "server-only" not in str(body)
    assert relay["urls"] == [turn.url]
    expiry, name = relay["username"].split(":")
    assert int(expiry) == body["expires_at"]
    assert abs(body["expires_at"] - (time.time() + 7200)) <= 5
    assert name.startswith("key_")  # the key's id, never the key
    # What a client is handed, coturn accepts.
    await allocate(turn, relay["username"], relay["credential"])
    # coturn's quota counts per user: a key's credentials are spread over a
    # few users, never more, so one caller can neither lock out the key's
    # other callers (one user for all) nor take the server (one per request).
    users = set()
    for _ in range(40):
        async with http.get(server.url + "/v1/ice-servers", headers=headers) as answer:
            users.add((await answer.json())["ice_servers"][1]["username"].split(":")[1])
    assert 2 <= len(users) <= TURN_USERS_PER_NAME, users
    assert all(user.startswith(name.rsplit(".", 1)[0] + ".") for user in users)
    # Without keys, each client address is a name of its own.
    open_server = await server_factory(turn_secret=turn.secret, turn_urls=[turn.url])
    async with http.get(open_server.url + "/v1/ice-servers") as answer:
        (relay,) = (await answer.json())["ice_servers"]
    assert relay["username"].split(":")[1].startswith("anon-127.0.0.1.")


async def test_without_turn_a_client_is_handed_no_credentials(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory()
    async with http.get(server.url + "/v1/ice-servers") as answer:
        assert answer.status == 200
        assert await answer.json() == {"ice_servers": [], "expires_at": None}


@pytest.mark.e2e
@pytest.mark.slow
async def test_a_call_relayed_through_turn_is_answered(
    server_factory: ServerFactory, http: aiohttp.ClientSession, turn: TurnServer
) -> None:
    server = await server_factory(turn_secret=turn.secret, turn_urls=[turn.url])
    ice_servers = await fetch_ice_servers(http, server.url)
    client = RealtimeClient(server.url, ice_servers=ice_servers, relay_only=True)
    try:
        await client.connect(http)
        # Only relay candidates were offered, so only a relayed pair can work.
        offered = client.pc.localDescription.sdp
        assert "typ relay" in offered and "typ host" not in offered
        # The server's own peer connection minted credentials coturn accepted.
        (call,) = server.calls.calls()
        assert isinstance(call, Call)
        assert "typ relay" in call.pc.localDescription.sdp
        await asyncio.wait_for(client.wait_for_type("session.created"), 10)
        done = client.wait_for_type("response.done")
        sent = await client.mic.play(np.concatenate((librivox("0930"), silence(0.3))), 16000)
        response = (await asyncio.wait_for(done, 60))["response"]
        assert response["status"] == "completed"
        assert client.of_type("conversation.item.input_audio_transcription.completed")
        assert client.received.first_sound_after(sent) is not None, "no audio came back"
        selected = client.selected_candidates()
        assert selected is not None and selected[0] == "relay", selected
    finally:
        await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
