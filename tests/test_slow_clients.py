"""A client that asks for more than it reads, or sends audio faster than
anyone speaks, is bounded: its call ends (or its excess is dropped) and
other calls go on. Real server, real calls (over the fake models: the
bounds are the server's, not a model's): an aiortc peer whose SCTP stops
acknowledging, a WebSocket nobody reads (through aiohttp's client, and
one that never reads a byte), a flood of appended audio."""

from __future__ import annotations

import asyncio
import base64
import json
import os
from typing import Any

import aiohttp
import numpy as np

from tests.conftest import ServerFactory
from tests.realtime_events import typed
from tests.silent_websocket import SilentWebSocket, let_go_of
from voice_agent.client import RealtimeClient
from voice_agent.realtime.input_audio import APPEND_BURST_S, INPUT_RATE, MAX_APPEND_SPEED
from voice_agent.realtime.protocol import MAX_CLIENT_EVENT_BYTES, MAX_UNSENT_EVENT_BYTES
from voice_agent.rtc.call import Call
from voice_agent.testing.scripted_llm import Script, ScriptedLlmServer, chat_text
from voice_agent.ws.call import WebSocketCall
from voice_agent.ws.closing import SLOW_CLIENT_CLOSE_CODE

# One item as large as an event may carry, asked for again and again: each
# retrieval is ~200 KB the server must send.
LARGE_TEXT = "word " * 40_000
RETRIEVALS = 120  # ~24 MB asked for: more than the bound and any socket buffer


def store_and_retrieve(item_id: str) -> list[dict[str, Any]]:
    item = typed(LARGE_TEXT)
    item["item"]["id"] = item_id
    retrieve = {"type": "conversation.item.retrieve", "item_id": item_id}
    return [item, *([retrieve] * RETRIEVALS)]


def stop_acknowledging(client: RealtimeClient) -> None:
    """The client's SCTP drops every chunk that carries data from now on:
    it neither reads nor acknowledges, as a stalled or hostile peer."""
    assert client.pc.sctp is not None
    sctp = client.pc.sctp
    receive_chunk = sctp._receive_chunk

    async def drop_data(chunk: Any) -> None:
        if type(chunk).__name__ != "DataChunk":
            await receive_chunk(chunk)

    sctp._receive_chunk = drop_data  # type: ignore[method-assign]


async def test_a_peer_that_stops_acknowledging_is_ended_and_other_calls_go_on(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    other = RealtimeClient(server.url)
    flooder = RealtimeClient(server.url)
    for client in (other, flooder):
        await client.connect(http)
        await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    (flooding,) = [c for c in server.calls.calls() if c.id == flooder.call_url.rsplit("/", 1)[-1]]
    assert isinstance(flooding, Call) and flooding._channel is not None
    channel = flooding._channel
    most_buffered = 0

    def watch() -> None:  # the server's queue for this peer, after every send
        nonlocal most_buffered
        most_buffered = max(most_buffered, channel.bufferedAmount)

    channel.on("bufferedamountlow", watch)
    stop_acknowledging(flooder)
    for event in store_and_retrieve("item_large"):
        flooder.send(event)
        watch()
        await asyncio.sleep(0)  # let the server read as it comes
    async with asyncio.timeout(30):
        await flooding.closed.wait()
    assert flooding.close_reason == "slow_client"
    assert most_buffered <= MAX_UNSENT_EVENT_BYTES

    # The other caller is still served: a turn asked for is answered aloud.
    mark = len(other.events)
    other.send(typed("Say hello."))
    other.send({"type": "response.create"})
    done = await asyncio.wait_for(other.wait_for_type("response.done", after=mark), 60)
    assert done["response"]["status"] == "completed", done["response"]
    await other.hangup(http)
    await flooder.pc.close()
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


def ws_url(url: str) -> str:
    return url.replace("http://", "ws://") + "/v1/realtime?model=default"


async def test_a_websocket_nobody_reads_is_ended_with_bounded_memory(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    async with http.ws_connect(ws_url(server.url), protocols=("realtime",)) as ws:
        (call,) = server.calls.calls()
        assert isinstance(call, WebSocketCall)
        most_queued = 0
        for event in store_and_retrieve("item_large"):  # and never read a reply
            await ws.send_str(json.dumps(event))
            most_queued = max(most_queued, call._outbox_bytes)
            if call.closed.is_set():
                break
        async with asyncio.timeout(30):
            await call.closed.wait()
        assert call.close_reason == "slow_client"
        assert most_queued <= MAX_UNSENT_EVENT_BYTES
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


async def test_a_websocket_client_that_never_reads_a_byte_is_let_go_of(
    fake_server_factory: ServerFactory,
) -> None:
    server = await fake_server_factory()
    client = await SilentWebSocket.connect(server.url)
    try:
        (call,) = server.calls.calls()
        for event in store_and_retrieve("item_large"):
            if call.closed.is_set() or not await client.send(event):
                break
        async with asyncio.timeout(30):
            await call.closed.wait()
        assert call.close_reason == "slow_client"
        # Its connection too, with the megabytes it never read: held, it
        # would stay until the client went away.
        assert await let_go_of(os.getpid(), client.local_port, within_s=10)
        # And its release ended as a release, not cancelled (aiohttp's close
        # awaits the drain of the writer cancelled mid-send).
        await call.close()
    finally:
        client.close()
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


async def test_a_call_the_front_ends_for_a_slow_client_is_recorded_as_such(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    # Behind the front, the worker's client is the front: it closes with
    # this code when its own client stopped reading.
    server = await fake_server_factory()
    async with http.ws_connect(ws_url(server.url), protocols=("realtime",)) as ws:
        assert (await ws.receive_json())["type"] == "session.created"
        (call,) = server.calls.calls()
        await ws.close(code=SLOW_CLIENT_CLOSE_CODE)
    async with asyncio.timeout(10):
        await call.closed.wait()
    assert call.close_reason == "slow_client"


async def test_events_count_by_what_they_cost_to_parse(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    # 256 KiB of empty arrays: ~87,000 values to build and walk for the
    # nesting check, tens of ms of the loop every session shares; under a
    # flat count, 100 of them a second were within the rate.
    costly = '{"type":"x","a":[' + ",".join(["[]"] * 87_000) + "]}"
    assert len(costly) <= MAX_CLIENT_EVENT_BYTES
    server = await fake_server_factory()
    async with http.ws_connect(ws_url(server.url), protocols=("realtime",), max_msg_size=0) as ws:
        assert (await ws.receive_json())["type"] == "session.created"
        for _ in range(30):
            await ws.send_str(costly)
        await asyncio.sleep(1.5)  # the budget refills
        await ws.send_json({"type": "session.update", "session": {"instructions": "Hi."}})
        codes = []
        async with asyncio.timeout(30):
            while (event := await ws.receive_json())["type"] != "session.updated":
                codes.append(event["error"]["code"])
    # Each one counts as ~88 events of the 200 a session may send at once
    # and 100 a second: two parsed at once, one more each 0.9 s the sending
    # takes (a few on a slow host), the rest dropped unparsed.
    assert 2 <= codes.count("unknown_event") <= 10, codes
    assert "rate_limited" in codes


async def test_the_items_a_call_keeps_are_bounded_in_size(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    # 24 items of ~240 KB (~5.8 MB): a thousand of them were all kept.
    server = await fake_server_factory()
    async with http.ws_connect(ws_url(server.url), protocols=("realtime",)) as ws:
        assert (await ws.receive_json())["type"] == "session.created"
        for index in range(24):
            item = typed("word " * 48_000)
            item["item"]["id"] = f"item_{index}"
            await ws.send_json(item)
        for item_id in ("item_0", "item_23"):
            await ws.send_json({"type": "conversation.item.retrieve", "item_id": item_id})
        answers: list[dict[str, Any]] = []
        async with asyncio.timeout(30):
            while len(answers) < 2:
                event = await ws.receive_json()
                if event["type"] in ("error", "conversation.item.retrieved"):
                    answers.append(event)
    forgotten, kept = answers
    assert forgotten["type"] == "error" and forgotten["error"]["code"] == "item_not_found"
    assert kept["type"] == "conversation.item.retrieved" and kept["item"]["id"] == "item_23"
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


async def test_typed_items_held_during_a_reply_are_bounded_by_the_history(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession, fake_llm: ScriptedLlmServer
) -> None:
    # Typed during a reply, an item waits for the reply's end to join the
    # history, which keeps only the last few turns (--llm-history-turns):
    # only those few are held, where every one was (373 MiB in 20 s).
    server = await fake_server_factory()
    # A reply long enough (seconds of speech) for what is sent during it.
    fake_llm.add(Script(events=chat_text("one two three four five six seven eight " * 4)))
    async with http.ws_connect(ws_url(server.url), protocols=("realtime",)) as ws:
        assert (await ws.receive_json())["type"] == "session.created"
        await ws.send_json(typed("Say hello."))
        await ws.send_json({"type": "response.create"})
        async with asyncio.timeout(30):
            while (await ws.receive_json())["type"] != "response.created":
                pass
            for index in range(30):
                item = typed(f"note {index}")
                item["item"]["id"] = f"item_held_{index}"
                await ws.send_json(item)
            # Still during the reply: a reference finds what is held.
            for index in (0, 29):
                reference = {"type": "item_reference", "id": f"item_held_{index}"}
                await ws.send_json(
                    {
                        "type": "response.create",
                        "event_id": f"evt_{index}",
                        "response": {"conversation": "none", "input": [reference]},
                    }
                )
            errors: dict[str, str] = {}
            while (event := await ws.receive_json())["type"] != "response.done":
                if event["type"] == "error":
                    errors[event["error"].get("event_id")] = event["error"]["code"]
    # The oldest is no longer held; the newest is (found, then refused only
    # because a reply is going on).
    assert errors == {
        "evt_0": "item_not_found",
        "evt_29": "conversation_already_has_active_response",
    }, errors
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


async def test_a_few_large_tool_outputs_sent_at_once_are_all_taken(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    # What a client sends back for parallel tool calls: each output a JSON
    # text of 60,000 numbers, 180 KB (its commas count, in a string or not).
    output = json.dumps([0] * 60_000)
    server = await fake_server_factory()
    async with http.ws_connect(ws_url(server.url), protocols=("realtime",)) as ws:
        assert (await ws.receive_json())["type"] == "session.created"
        for index in range(5):
            item = {"type": "function_call_output", "call_id": f"call_{index}", "output": output}
            await ws.send_json({"type": "conversation.item.create", "item": item})
        codes: list[str] = []
        async with asyncio.timeout(30):
            while len(codes) < 5:
                event = await ws.receive_json()
                if event["type"] == "error":
                    codes.append(event["error"]["code"])
    # Each was read and judged (no such call is waiting), none dropped unread.
    assert codes == ["invalid_value"] * 5, codes


def appended(seconds: float) -> list[str]:
    """``seconds`` of (silent) PCM16 at 24 kHz as append events of 0.5 s."""
    pcm = np.zeros(int(seconds * INPUT_RATE), dtype="<i2").tobytes()
    step = INPUT_RATE  # 0.5 s of 16-bit samples
    return [
        json.dumps(
            {
                "type": "input_audio_buffer.append",
                "audio": base64.b64encode(pcm[i : i + step]).decode(),
            }
        )
        for i in range(0, len(pcm), step)
    ]


async def errors_until(ws: aiohttp.ClientWebSocketResponse, count: int) -> list[dict[str, Any]]:
    errors: list[dict[str, Any]] = []
    async with asyncio.timeout(15):
        async for message in ws:
            event = message.json()
            if event["type"] == "error":
                errors.append(event["error"])
                if len(errors) == count:
                    return errors
    raise AssertionError(f"the socket closed after {errors}")


async def test_audio_appended_far_faster_than_real_time_is_dropped_beyond_its_pace(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    flood_s = 60.0
    async with http.ws_connect(ws_url(server.url), protocols=("realtime",)) as ws:
        await ws.send_json(
            {
                "type": "session.update",
                "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}},
            }
        )
        started = asyncio.get_running_loop().time()
        for text in appended(flood_s):
            await ws.send_str(text)
        (first,) = await errors_until(ws, 1)
        sent_s = asyncio.get_running_loop().time() - started
        assert first["code"] == "rate_limited" and first["param"] == "audio", first
        # Told once a second, with what was dropped so far: one more chunk
        # over the pace after that second says how much of the flood went.
        await asyncio.sleep(1.1)
        for text in appended(8.0):
            await ws.send_str(text)
        (second,) = await errors_until(ws, 1)
        dropped_ms = int(second["message"].split(": ")[1].split(" ms")[0])
        # Accepted: the allowance, plus the pace while the flood was sent.
        most_accepted_s = APPEND_BURST_S + MAX_APPEND_SPEED * (sent_s + 1.1 + 1.0)
        assert dropped_ms >= (flood_s + 8.0 - most_accepted_s) * 1000, (dropped_ms, sent_s)
        assert dropped_ms <= (flood_s + 8.0 - APPEND_BURST_S) * 1000
        # The call itself is fine: the client can go on.
        await ws.send_json({"type": "input_audio_buffer.clear"})
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)
