"""A drain that meets a call on its way in or out. An offer still being
negotiated is refused once answered (503 ``shutting_down``, so the client
tries another replica), and the drain waits for it rather than leaving a
call made after it; a call already closing gets no goodbye, which nothing
would play or stop. The real app in process over the fake models, real
callers."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from tests.conftest import ServerFactory
from tests.leaks import counted_tasks
from voice_agent.client import RealtimeClient
from voice_agent.server.drain import drain_app, end_with_goodbye
from voice_agent.ws.call import WebSocketCall


async def test_an_offer_negotiated_when_the_drain_begins_is_refused_and_waited_for(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    # A STUN server that never answers keeps the server's ICE gathering, and
    # so its answer, waiting.
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


async def test_a_call_closing_when_the_drain_time_is_up_gets_no_goodbye(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    url = server.url.replace("http://", "ws://") + "/v1/realtime?model=default"
    async with http.ws_connect(url, protocols=("realtime",)) as ws:
        assert (await ws.receive_json())["type"] == "session.created"
        (call,) = server.calls.calls()
        assert isinstance(call, WebSocketCall)
        before = counted_tasks()
        teardown = call.close_soon("hangup")
        # Into the release: the session closed, the socket not yet.
        for _ in range(3):
            await asyncio.sleep(0)
        assert call.closing and not call.closed.is_set()
        async with asyncio.timeout(1):  # not the goodbye's 10 s
            await end_with_goodbye(call, "Goodbye.")
        await teardown
        assert call.session.say_goodbye("Goodbye.") is None
    assert call.close_reason == "hangup"
    # No reply was started that nothing would stop (its tasks are named
    # after the response: resp_...-play).
    left = {task.get_name() for task in counted_tasks() - before}
    assert not {name for name in left if name.startswith("resp_")}, left
