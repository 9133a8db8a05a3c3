"""A drain that begins while an offer is still being negotiated: the offer
is refused once answered (503 ``shutting_down``, so the client tries
another replica), and the drain waits for it rather than leaving a call
made after it. The real app in process over the fake models, a real
aiortc caller; a STUN server that never answers keeps the server's ICE
gathering (and so the answer) waiting."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from tests.conftest import ServerFactory
from voice_agent.client import RealtimeClient
from voice_agent.server.drain import drain_app


async def test_an_offer_negotiated_when_the_drain_begins_is_refused_and_waited_for(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as silent_stun:
        silent_stun.bind(("127.0.0.1", 0))
        stun_port = silent_stun.getsockname()[1]
        server = await fake_server_factory(
            ice_servers=[f"stun:127.0.0.1:{stun_port}"], drain_timeout_s=0.1
        )
        client = RealtimeClient(server.url)
        connecting = asyncio.create_task(client.connect(http))
        async with asyncio.timeout(10):
            while True:
                if server.calls.load > 0:  # admitted: its slot is reserved
                    break
                await asyncio.sleep(0.01)
        draining = asyncio.create_task(drain_app(server.app))
        # Past its timeout with no call live, the drain still waits for the
        # offer (gathering takes ~5 s against the silent STUN server).
        await asyncio.sleep(0.5)
        assert not draining.done() and not connecting.done()
        with pytest.raises(RuntimeError, match=r"503.*shutting_down"):
            await asyncio.wait_for(connecting, 60)
        await asyncio.wait_for(draining, 60)
        assert len(server.calls) == 0 and server.calls.load == 0
        assert server.calls.calls_total == 0  # no call was made
        await client.pc.close()
