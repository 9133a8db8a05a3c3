"""``GET /v1/realtime``: the same session over a WebSocket, with OpenAI's own
Python SDK as one of the peers. Real server, real models."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import aiohttp
import numpy as np
import pytest
from openai import AsyncOpenAI

from tests.conftest import RunningServer, ServerFactory
from voice_agent.audio.resample import StreamResampler
from voice_agent.testing.audio_data import librivox, reference, silence, word_error_rate

pytestmark = pytest.mark.e2e

WIRE_RATE = 24_000


def ws_url(server: RunningServer) -> str:
    return server.url.replace("http://", "ws://") + "/v1/realtime?model=default"


async def events_until(
    ws: aiohttp.ClientWebSocketResponse, last: str, timeout_s: float = 60
) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout_s):
        async for message in ws:
            assert message.type == aiohttp.WSMsgType.TEXT, message
            events.append(message.json())
            if events[-1]["type"] == last:
                return events
    raise AssertionError(f"the socket closed before {last}: {[e['type'] for e in events]}")


def typed_turn(text: str) -> list[dict[str, Any]]:
    return [
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            },
        },
        {"type": "response.create"},
    ]


def audio_of(events: list[dict[str, Any]]) -> np.ndarray:
    deltas = [e["delta"] for e in events if e["type"] == "response.output_audio.delta"]
    return np.frombuffer(b"".join(base64.b64decode(d) for d in deltas), dtype="<i2")


async def test_a_typed_turn_over_a_websocket_is_answered_in_paced_audio_deltas(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory()
    async with http.ws_connect(ws_url(server), protocols=("realtime",)) as ws:
        assert ws.protocol == "realtime"
        (created,) = await events_until(ws, "session.created", 10)
        assert created["session"]["audio"]["output"]["format"] == {
            "type": "audio/pcm",
            "rate": WIRE_RATE,
        }
        assert len(server.calls) == 1
        started = asyncio.get_running_loop().time()
        for event in typed_turn("Hello! How are you today?"):
            await ws.send_json(event)
        events = await events_until(ws, "response.done")
        took = asyncio.get_running_loop().time() - started
        done = events[-1]["response"]
        assert done["status"] == "completed", done.get("status_details")
        audio = audio_of(events)
        assert audio.size > WIRE_RATE // 2 and int(np.abs(audio).max()) > 2000
        # Paced: the deltas took about as long to arrive as they last to play.
        assert took >= audio.size / WIRE_RATE - 0.2
        delta = next(e for e in events if e["type"] == "response.output_audio.delta")
        assert delta["response_id"] == done["id"]
        assert delta["item_id"] == done["output"][0]["id"]
        transcript = done["output"][0]["content"][0]["transcript"]
        assert transcript.strip()
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)  # closing the socket ends the call


@pytest.mark.slow
async def test_openais_python_sdk_talks_to_the_websocket_unchanged(
    server_factory: ServerFactory,
) -> None:
    """A spoken turn in as appended audio, the transcript and audio deltas
    out, through OpenAI's own client, unchanged but for its base URL."""
    server = await server_factory(auth="required", api_keys=["sk-sdk-test-0123456"])
    client = AsyncOpenAI(base_url=server.url + "/v1", api_key="sk-sdk-test-0123456")
    speech = StreamResampler(16_000, WIRE_RATE).process(
        np.concatenate((librivox("0930"), silence(1.0))), last=True
    )
    async with client.realtime.connect(model="default") as connection:
        first = await asyncio.wait_for(connection.recv(), 10)
        assert first.type == "session.created"
        await connection.session.update(
            session={"type": "realtime", "instructions": "Answer in one short sentence."}
        )
        chunk = WIRE_RATE // 10  # 100 ms, as clients typically send
        for start in range(0, speech.size, chunk):
            pcm = speech[start : start + chunk].astype("<i2").tobytes()
            await connection.input_audio_buffer.append(audio=base64.b64encode(pcm).decode())
        kinds: list[str] = []
        heard = ""
        audio = b""
        async with asyncio.timeout(60):
            async for event in connection:
                kinds.append(event.type)
                if event.type == "conversation.item.input_audio_transcription.completed":
                    heard = event.transcript
                if event.type == "response.output_audio.delta":
                    audio += base64.b64decode(event.delta)
                if event.type == "response.done":
                    assert event.response.status == "completed"
                    break
        assert word_error_rate(reference("0930"), heard) <= 0.2, heard
        assert "session.updated" in kinds and "input_audio_buffer.speech_started" in kinds
        assert "response.output_audio_transcript.delta" in kinds
        assert len(audio) > WIRE_RATE  # over half a second of PCM16
    await client.close()


async def test_a_websocket_without_a_key_is_refused_before_the_upgrade(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(auth="required", api_keys=["sk-ws-test-01234567"])
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await http.ws_connect(ws_url(server))
    assert refused.value.status == 401
    assert len(server.calls) == 0
    # A browser cannot set headers on a WebSocket: the key as a subprotocol.
    async with http.ws_connect(
        ws_url(server), protocols=("realtime", "openai-insecure-api-key.sk-ws-test-01234567")
    ) as ws:
        (created,) = await events_until(ws, "session.created", 10)
        assert created["type"] == "session.created"


@pytest.mark.parametrize(
    ("session", "code", "param"),
    [
        ({"instructions": 5}, "invalid_type", "session.instructions"),
        (
            {
                "audio": {
                    "input": {"turn_detection": {"type": "semantic_vad", "eagerness": ["low"]}}
                }
            },
            "invalid_value",
            "session.audio.input.turn_detection.eagerness",
        ),
    ],
)
async def test_a_secret_bound_to_a_bad_session_gets_a_whole_error_event_and_no_call(
    server_factory: ServerFactory,
    http: aiohttp.ClientSession,
    session: dict[str, object],
    code: str,
    param: str,
) -> None:
    key = "sk-ws-test-01234567"
    server = await server_factory(auth="required", api_keys=[key])
    body = {"session": session}  # minted as given: checked when it is used
    headers = {"Authorization": f"Bearer {key}"}
    async with http.post(
        server.url + "/v1/realtime/client_secrets", json=body, headers=headers
    ) as minted:
        secret = (await minted.json())["value"]
    async with http.ws_connect(
        ws_url(server), protocols=("realtime", f"openai-insecure-api-key.{secret}")
    ) as ws:
        (refused,) = await events_until(ws, "error", 10)
        # The shape every error event has: its own id, and a code and param to act on.
        assert refused["event_id"].startswith("event_")
        assert refused["error"]["code"] == code
        assert refused["error"]["param"] == param
        assert (await ws.receive()).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
    # No call is left holding a slot.
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
