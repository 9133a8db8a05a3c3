"""A caller whose audio stream says goodbye (RTCP BYE: what a phone gateway
sends at hang-up) ends its call at once, while the peer connection itself
is still up; another caller's call goes on. Real server and real aiortc
callers over the fake models."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.conftest import ServerFactory
from voice_agent.client import RealtimeClient


async def connected(server_url: str, http: aiohttp.ClientSession) -> RealtimeClient:
    client = RealtimeClient(server_url)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    return client


async def test_rtcp_bye_ends_the_call_and_only_that_call(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    leaving, staying = await connected(server.url, http), await connected(server.url, http)
    assert leaving.location is not None and staying.location is not None
    staying_id = staying.location.rsplit("/", 1)[1]
    assert len(server.calls) == 2

    # Stopping the sender sends an RTCP BYE for its stream; the peer
    # connection (ICE, DTLS, the data channel) stays up.
    (sender,) = [s for s in leaving.pc.getSenders() if s.track is not None]
    await sender.stop()
    await asyncio.wait_for(server.calls.wait_for_count(1), 5)
    assert server.calls.ended == {"peer_bye": 1}
    assert leaving.pc.connectionState == "connected"  # it was the BYE, not a closed connection
    remaining = server.calls.get(staying_id)
    assert remaining is not None and not remaining.closing

    # The other call still talks.
    done = staying.wait_for_type("response.done", after=len(staying.events))
    staying.send({"type": "response.create", "response": {"instructions": "Say hi."}})
    assert (await asyncio.wait_for(done, 10))["response"]["status"] == "completed"

    await leaving.hangup(http)
    await staying.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
