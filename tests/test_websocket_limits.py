"""A WebSocket call holds a call slot, so it has a WebRTC call's limits: the
longest call, a client that stops sending, a client that is gone without
closing (heartbeat pings unanswered). Real server, real sockets, fake models."""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from tests.conftest import RunningServer, ServerFactory
from voice_agent.ws.call import WebSocketCall


def ws_url(server: RunningServer) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime?model=default"


def only_call(server: RunningServer) -> WebSocketCall:
    (call,) = server.calls.calls()
    assert isinstance(call, WebSocketCall)
    return call


async def read_for(ws: aiohttp.ClientWebSocketResponse, seconds: float) -> None:
    """Read (and so answer pings) for ``seconds``, or until the socket closes."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            async for _ in ws:
                pass


async def test_a_websocket_call_ends_at_the_longest_call_duration(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(max_call_duration_s=2.0)
    async with http.ws_connect(ws_url(server), protocols=("realtime",)) as ws:
        call = only_call(server)
        started = asyncio.get_running_loop().time()
        await read_for(ws, 15)
        assert ws.closed
        took = asyncio.get_running_loop().time() - started
    assert call.close_reason == "max_duration"
    assert took >= 1.5, took
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_a_websocket_client_that_sends_nothing_is_ended_one_that_sends_is_not(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(ws_idle_timeout_s=1.0)
    async with http.ws_connect(ws_url(server), protocols=("realtime",)) as ws:
        call = only_call(server)
        # Active for three idle timeouts: an event every 0.4 s keeps it.
        for _ in range(8):
            await ws.send_json({"type": "input_audio_buffer.clear"})
            await read_for(ws, 0.4)
        assert not call.closed.is_set()
        await read_for(ws, 10)  # then silent
        assert ws.closed
    assert call.close_reason == "idle_timeout"
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_a_websocket_client_that_stops_answering_pings_is_ended(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(ws_heartbeat_s=0.5)
    # A client that reads answers the pings: it stays.
    async with http.ws_connect(ws_url(server), protocols=("realtime",)) as ws:
        await read_for(ws, 2.0)
        assert not ws.closed
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    # One that does not (gone, or hung, with its TCP connection still open).
    async with http.ws_connect(ws_url(server), protocols=("realtime",), autoping=False) as ws:
        call = only_call(server)
        async with asyncio.timeout(10):
            await call.closed.wait()
    assert call.close_reason == "peer_lost"
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
