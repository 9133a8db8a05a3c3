"""The debug endpoints (``--debug-endpoints``) that bench/soak.py reads: off
by default, and when on, their counts follow a real call as it starts and
ends (the client and the server share this process, so both peers count).
Over the fake models: the objects counted are the server's, not a model's."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.conftest import ServerFactory
from voice_agent.client import RealtimeClient
from voice_agent.memory import TRIMMER


async def memory(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/debug/memory", params={"types": "1"}) as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


async def test_debug_endpoints_are_off_by_default(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    for method, path in [("GET", "/debug/memory"), ("POST", "/debug/malloc-trim")]:
        async with http.request(method, server.url + path) as response:
            assert response.status in (404, 405)


async def test_live_objects_follow_a_call_and_return_to_zero(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(debug_endpoints=True)
    before = await memory(http, server.url)
    assert before["calls"] == 0 and before["objects"]["Call"] == 0
    assert before["types"]["voice_agent.server.calls.CallRegistry"] >= 1

    client = RealtimeClient(server.url)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    during = await memory(http, server.url)
    assert during["calls"] == 1
    assert during["objects"]["Call"] == 1 and during["objects"]["VoiceSession"] == 1
    # This test's peer and the server's, each with its ICE, DTLS and SCTP.
    for kind in ("RTCPeerConnection", "RTCDtlsTransport", "RTCSctpTransport"):
        assert during["objects"][kind] >= before["objects"][kind] + 2, kind
    # The server's outbound track, the client's microphone, and each side's remote track.
    assert during["objects"]["MediaStreamTrack"] >= before["objects"]["MediaStreamTrack"] + 4
    assert during["tasks"] > before["tasks"]

    await client.hangup(http)
    del client
    await asyncio.wait_for(TRIMMER.wait(), 5)
    after = await memory(http, server.url)
    assert after["calls"] == 0
    assert after["objects"] == before["objects"]
    # --malloc-trim (the default): the call's end gave the free heap back.
    assert after["trims_after_calls"]["trims"] > before["trims_after_calls"]["trims"]


async def test_heap_stats_and_malloc_trim(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(debug_endpoints=True)
    heap = (await memory(http, server.url))["heap"]
    assert heap is not None  # glibc: the CI image and the service image
    assert heap["arenas"] >= 1 and heap["in_use_bytes"] > 0 and heap["free_bytes"] >= 0
    async with http.post(server.url + "/debug/malloc-trim") as response:
        assert response.status == 200
        body = await response.json()
    assert body["seconds"] >= 0 and body["rss_after_bytes"] > 0
