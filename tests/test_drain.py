"""Graceful drain: SIGTERM stops new calls at once, lets live ones go on,
then ends each with the spoken goodbye and its response.done, and the
process exits 0. Real server processes, real aiortc callers."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import aiohttp
import pytest

from tests.test_websocket import events_until, typed_turn
from voice_agent.client import RealtimeClient
from voice_agent.config import Settings
from voice_agent.testing.serving import start_server, wait_ready

pytestmark = [pytest.mark.models, pytest.mark.slow]

GOODBYE = Settings.model_fields["drain_goodbye"].default


async def stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.send_signal(signal.SIGINT)  # at once, whatever the test left
        async with asyncio.timeout(30):
            await process.wait()


async def draining_readiness(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    """/readyz once the signal has been handled (it is asynchronous)."""
    async with asyncio.timeout(10):
        while True:
            async with http.get(url + "/readyz") as response:
                body = await response.json()
                if body["status"] == "draining":
                    return response.status, response.headers.get("Retry-After", "")
            await asyncio.sleep(0.05)  # the signal reaches the server's loop soon


def ended_by_server(client: RealtimeClient) -> asyncio.Event:
    ended = asyncio.Event()
    client.channel.on("close", ended.set)
    return ended


async def check_drain(http: aiohttp.ClientSession, url: str, process: Any) -> None:
    client = RealtimeClient(url)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    ended = ended_by_server(client)
    process.send_signal(signal.SIGTERM)

    status, retry_after = await draining_readiness(http, url)
    assert status == 503 and retry_after
    late = RealtimeClient(url)
    with pytest.raises(RuntimeError, match=r"503.*shutting_down"):
        await late.connect(http)
    await late.hangup()
    # The live call is still being served while the drain time runs.
    assert not ended.is_set() and not client.of_type("response.done")

    done = await asyncio.wait_for(client.wait_for_type("response.done"), 30)
    heard_at = time.monotonic()
    response = done["response"]
    assert response["status"] == "completed", response
    (message,) = response["output"]
    assert message["content"][0]["transcript"] == GOODBYE
    # The goodbye was heard (audio), then the server hung up, then exited 0.
    assert client.received.peak_between(heard_at - 10, heard_at) > 1000
    await asyncio.wait_for(ended.wait(), 15)
    async with asyncio.timeout(30):
        assert await process.wait() == 0
    await client.hangup()


@pytest.mark.parametrize("workers", ["0", "2"])
async def test_sigterm_drains_live_calls_then_ends_them_with_a_goodbye(
    http: aiohttp.ClientSession, workers: str
) -> None:
    process, url = await start_server("--workers", workers, "--drain-timeout-s", "3")
    try:
        await wait_ready(http, url, timeout_s=240)
        await check_drain(http, url, process)
    finally:
        await stop(process)


async def test_a_drain_ends_as_soon_as_the_last_call_hangs_up(
    http: aiohttp.ClientSession,
) -> None:
    process, url = await start_server("--workers", "0", "--drain-timeout-s", "600")
    try:
        await wait_ready(http, url)
        client = RealtimeClient(url)
        await client.connect(http)
        process.send_signal(signal.SIGTERM)
        await draining_readiness(http, url)
        await client.hangup(http)
        # Long before the drain time: nothing was left to wait for.
        async with asyncio.timeout(60):
            assert await process.wait() == 0
        assert not client.of_type("response.done")  # no goodbye for a call that had ended
    finally:
        await stop(process)


async def test_a_second_signal_stops_a_drain_at_once(http: aiohttp.ClientSession) -> None:
    process, url = await start_server("--workers", "0", "--drain-timeout-s", "600")
    try:
        await wait_ready(http, url)
        client = RealtimeClient(url)
        await client.connect(http)
        ended = ended_by_server(client)
        process.send_signal(signal.SIGTERM)
        await draining_readiness(http, url)
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            assert await process.wait() == 0
        await asyncio.wait_for(ended.wait(), 15)
        await client.hangup()
    finally:
        await stop(process)


async def test_a_websocket_session_hears_the_goodbye_and_is_closed(
    http: aiohttp.ClientSession,
) -> None:
    process, url = await start_server("--workers", "0", "--drain-timeout-s", "1")
    try:
        await wait_ready(http, url)
        ws_url = url.replace("http://", "ws://") + "/v1/realtime"
        async with http.ws_connect(ws_url, protocols=("realtime",)) as ws:
            await events_until(ws, "session.created", 10)
            process.send_signal(signal.SIGTERM)
            events = await events_until(ws, "response.done", 30)
            audio = [e for e in events if e["type"] == "response.output_audio.delta"]
            assert audio, [e["type"] for e in events]
            done = events[-1]["response"]
            assert done["status"] == "completed"
            assert done["output"][0]["content"][0]["transcript"] == GOODBYE
            async with asyncio.timeout(15):
                assert await ws.receive() is not None and ws.closed
        async with asyncio.timeout(30):
            assert await process.wait() == 0
    finally:
        await stop(process)


async def test_sigterm_to_the_whole_process_group_drains_with_the_llm_still_answering(
    http: aiohttp.ClientSession,
) -> None:
    """A service manager's control group or a terminal signals every process
    of the service at once: the embedded LLM is the service's child, and it
    must not die under the calls the drain lets finish."""
    process, url = await start_server(
        "--workers", "0", "--drain-timeout-s", "600", own_process_group=True
    )
    try:
        await wait_ready(http, url)
        ws_url = url.replace("http://", "ws://") + "/v1/realtime"
        async with http.ws_connect(ws_url, protocols=("realtime",)) as ws:
            await events_until(ws, "session.created", 10)
            os.killpg(process.pid, signal.SIGTERM)
            await draining_readiness(http, url)
            for event in typed_turn("What is the capital of France?"):
                await ws.send_json(event)
            events = await events_until(ws, "response.done", 60)
            response = events[-1]["response"]
            assert response["status"] == "completed", response
            transcript = response["output"][0]["content"][0]["transcript"]
            assert transcript and transcript != GOODBYE
        # The last call hung up: the drain is over.
        async with asyncio.timeout(60):
            assert await process.wait() == 0
    finally:
        await stop(process)
