"""Audio sent as events (input_audio_buffer.append / commit / clear) over a
real WebRTC call, the caller's media track carrying only silence meanwhile:
it is heard as RTP audio is, with turn detection or push-to-talk."""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest

from tests.conftest import ServerFactory
from tests.realtime_events import appended_audio
from voice_agent.client import RealtimeClient
from voice_agent.testing.audio_data import librivox, reference, silence, word_error_rate

QUESTION = "0930"


async def connected(server_url: str, http: aiohttp.ClientSession) -> RealtimeClient:
    client = RealtimeClient(server_url)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    return client


def question_without_trailing_silence() -> np.ndarray:
    # Its speech ends 0.43 s before the clip does: cut so the turn is still
    # open (no 500 ms silence) when the client commits it.
    return librivox(QUESTION)[: int(2.9 * 16_000)]


@pytest.mark.e2e  # real speech, heard by the real STT
@pytest.mark.slow
async def test_appended_speech_and_a_commit_are_heard_and_answered(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory()
    client = await connected(server.url, http)
    done = client.wait_for_type("response.done")
    # Streamed as a live client streams it, while the silent media track
    # keeps sending: only the appended audio may reach the session.
    for event in appended_audio(question_without_trailing_silence(), chunk_ms=100):
        client.send(event)
        await asyncio.sleep(0.1)
    client.send({"type": "input_audio_buffer.commit", "event_id": "evt_commit"})
    response = (await asyncio.wait_for(done, 30))["response"]

    (committed,) = client.of_type("input_audio_buffer.committed")
    (heard,) = client.of_type("conversation.item.input_audio_transcription.completed")
    assert heard["item_id"] == committed["item_id"]
    assert client.of_type("input_audio_buffer.speech_started")[0]["item_id"] == heard["item_id"]
    assert word_error_rate(reference(QUESTION), heard["transcript"]) <= 0.15, heard
    assert response["status"] == "completed"
    assert response["output"][0]["content"][0]["transcript"].strip()
    assert client.of_type("output_audio_buffer.started")
    assert not client.of_type("error"), client.of_type("error")
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


@pytest.mark.e2e
@pytest.mark.slow
async def test_push_to_talk_waits_for_commit_and_response_create(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory()
    client = await connected(server.url, http)
    client.send(
        {"type": "session.update", "session": {"audio": {"input": {"turn_detection": None}}}}
    )
    updated = await asyncio.wait_for(client.wait_for_type("session.updated"), 5)
    assert updated["session"]["audio"]["input"]["turn_detection"] is None

    # With turn detection, the second of trailing silence would end the turn.
    for event in appended_audio(np.concatenate((librivox(QUESTION), silence(1.0)))):
        client.send(event)
    await asyncio.sleep(1.5)
    kinds = {e["type"] for e in client.events}
    assert not kinds & {
        "input_audio_buffer.speech_started",
        "input_audio_buffer.committed",
        "response.created",
    }, kinds

    transcribed = client.wait_for_type("conversation.item.input_audio_transcription.completed")
    client.send({"type": "input_audio_buffer.commit"})
    heard = await asyncio.wait_for(transcribed, 15)
    assert word_error_rate(reference(QUESTION), heard["transcript"]) <= 0.15, heard
    (committed,) = client.of_type("input_audio_buffer.committed")
    assert committed["item_id"] == heard["item_id"]
    await asyncio.sleep(1.0)
    assert not client.of_type("response.created"), "committed by hand, it is not answered"
    (call,) = server.calls.calls()
    assert call.session.conversation.history[-1].role == "user"

    done = client.wait_for_type("response.done")
    client.send({"type": "response.create"})
    response = (await asyncio.wait_for(done, 30))["response"]
    assert response["status"] == "completed"
    assert response["output"][0]["content"][0]["transcript"].strip()

    # Nothing buffered: a commit is refused, and clear empties what was appended.
    client.send({"type": "input_audio_buffer.commit", "event_id": "evt_empty"})
    error = await asyncio.wait_for(client.wait_for_type("error"), 5)
    assert error["error"]["code"] == "input_audio_buffer_commit_empty"
    assert error["error"]["event_id"] == "evt_empty"
    for event in appended_audio(librivox(QUESTION)):
        client.send(event)
    cleared = client.wait_for_type("input_audio_buffer.cleared")
    client.send({"type": "input_audio_buffer.clear"})
    await asyncio.wait_for(cleared, 5)
    mark = len(client.events)
    client.send({"type": "input_audio_buffer.commit"})
    error = await asyncio.wait_for(client.wait_for_type("error", after=mark), 5)
    assert error["error"]["code"] == "input_audio_buffer_commit_empty"
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_bad_audio_events_are_refused_naming_the_parameter(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    """Refused before any model hears it: over the fake models."""
    server = await fake_server_factory()
    client = await connected(server.url, http)
    for audio in (5, "not base64!", "AA=="):  # "AA==" decodes to a single byte
        mark = len(client.events)
        client.send({"type": "input_audio_buffer.append", "audio": audio})
        error = await asyncio.wait_for(client.wait_for_type("error", after=mark), 5)
        assert error["error"]["param"] == "audio", error
    await client.hangup(http)
