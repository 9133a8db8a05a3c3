"""End to end: a real aiortc peer talks to the real server and real models."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests.conftest import ServerFactory
from voice_agent.client import RealtimeClient
from voice_agent.testing.audio_data import (
    heard_as_its_own,
    librivox,
    reference,
    silence,
    word_error_rate,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def of(event_type: str) -> Any:
    return lambda e: e.get("type") == event_type


async def test_a_spoken_question_gets_a_spoken_answer(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory()
    client = RealtimeClient(server.url)
    await client.connect(http)
    created = await asyncio.wait_for(client.wait_for_type("session.created"), 5)
    assert created["session"]["type"] == "realtime"

    done = client.wait_for_type("response.done")
    speech_sent = await client.mic.play(np.concatenate((librivox("0930"), silence(0.3))), 16000)
    response = (await asyncio.wait_for(done, 30))["response"]

    # What the user said was heard.
    transcripts = client.of_type("conversation.item.input_audio_transcription.completed")
    assert len(transcripts) == 1
    assert word_error_rate(reference("0930"), transcripts[0]["transcript"]) <= 0.15
    user_item = transcripts[0]["item_id"]
    assert client.of_type("input_audio_buffer.speech_started")[0]["item_id"] == user_item
    assert client.of_type("input_audio_buffer.committed")[0]["item_id"] == user_item

    # The assistant answered in words and in sound.
    assert response["status"] == "completed"
    text = "".join(e["delta"] for e in client.of_type("response.output_audio_transcript.delta"))
    assert text.strip()
    assert response["output"][0]["content"][0]["transcript"].strip() == text.strip()
    first_sound = client.received.first_sound_after(speech_sent)
    assert first_sound is not None, "no audible audio came back"
    assert client.received.peak_between(first_sound, first_sound + 1.0) > 2000

    # Schema basics that OpenAI's own SDKs check.
    assert all(isinstance(e.get("event_id"), str) and e["event_id"] for e in client.events)
    assert client.events[0]["type"] == "session.created"
    kinds = [e["type"] for e in client.events]
    for earlier, later in [
        ("input_audio_buffer.speech_started", "input_audio_buffer.speech_stopped"),
        ("input_audio_buffer.speech_stopped", "response.created"),
        ("response.created", "response.output_audio_transcript.delta"),
        ("output_audio_buffer.started", "output_audio_buffer.stopped"),
        ("response.output_audio_transcript.done", "response.done"),
    ]:
        assert kinds.index(earlier) < kinds.index(later), (earlier, later)
    # Items are chained in conversation order.
    added = client.of_type("conversation.item.added")
    assert [a["item"]["role"] for a in added] == ["user", "assistant"]
    assert added[0]["previous_item_id"] is None
    assert added[1]["previous_item_id"] == user_item
    # Per-turn latency is reported on response.done.
    metadata = response["metadata"]
    assert float(metadata["voice_to_voice_ms"]) > 0
    assert float(metadata["stt_ms"]) > 0 and float(metadata["llm_ttft_ms"]) > 0

    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_barge_in_cancels_the_reply_and_stops_the_audio(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(llm_max_tokens=120)
    client = RealtimeClient(server.url)
    await client.connect(http)
    client.send(
        {
            "type": "session.update",
            "session": {
                "type": "realtime",
                "instructions": "Answer with a long, detailed story of at least five sentences.",
            },
        }
    )
    await asyncio.wait_for(client.wait_for_type("session.updated"), 5)

    started = client.wait_for_type("output_audio_buffer.started")
    await client.mic.play(np.concatenate((librivox("0880"), silence(0.3))), 16000)
    playing = await asyncio.wait_for(started, 30)
    # The assistant is mid-sentence once its voice arrives (polled: audio
    # frames come with no event), however late this host delivers it.
    playing_at = client.event_times[client.events.index(playing)]
    async with asyncio.timeout(10):
        while client.received.first_sound_after(playing_at, threshold=2000) is None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # a frame
    loop_now = client.received.arrivals[-1]
    assert client.received.peak_between(loop_now - 0.5, loop_now + 0.1) > 2000

    mark = len(client.events)
    done = client.wait_for(of("response.done"), after=mark)
    await client.mic.play(librivox("0930"), 16000)  # the user talks over it
    cancelled = (await asyncio.wait_for(done, 10))["response"]
    cancelled_at = client.event_times[
        client.events.index(next(e for e in client.events[mark:] if e["type"] == "response.done"))
    ]

    assert cancelled["status"] == "cancelled"
    assert cancelled["status_details"]["reason"] == "turn_detected"
    kinds = [e["type"] for e in client.events[mark:]]
    assert "input_audio_buffer.speech_started" in kinds
    assert "output_audio_buffer.cleared" in kinds
    # What was kept is what was heard: a prefix of what was generated.
    heard = cancelled["output"][0]["content"][0]["transcript"]
    spoken = "".join(e["delta"] for e in client.of_type("response.output_audio_transcript.delta"))
    assert spoken.replace(" ", "").startswith(heard.replace(" ", ""))
    # Cut off while its voice was coming, the reply keeps fewer words than it
    # gave the client. (Cut in a gap between two pieces, with the next one not
    # yet given, it rightly keeps them all: a slow machine can land there.)
    if client.received.peak_between(cancelled_at - 0.15, cancelled_at - 0.05) > 2000:
        assert len(heard) < len(spoken)

    # The audio stops: after the jitter buffer drains, only silence arrives
    # (until the reply to the interruption, which needs the user's turn to end).
    await asyncio.sleep(1.0)  # real time: the second after the cancel, listened to
    assert client.received.peak_between(cancelled_at + 0.25, cancelled_at + 1.0) < 200

    # The interruption itself is answered normally.
    final = await asyncio.wait_for(
        client.wait_for(
            lambda e: e.get("type") == "response.done" and e["response"]["status"] == "completed",
            after=mark,
        ),
        30,
    )
    assert final["response"]["output"][0]["content"][0]["transcript"]

    # The conversation history holds the interrupted reply as heard.
    (call,) = server.calls.calls()
    history = [(m.role, m.content) for m in call.session.conversation.history]
    assert ("assistant", heard) in history or not heard
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_five_simultaneous_callers_each_get_their_own_answer(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    """Shared, batched models: five callers speak at once; every turn is
    heard right and answered in sound, and no reply fails or is cut short
    by another caller's (the embedded LLM decodes them in parallel slots)."""
    server = await server_factory(max_calls=5)
    clips = ["0930", "0880", "0890", "0920", "0870"]

    async def caller(clip: str) -> tuple[str, dict[str, Any], float | None]:
        client = RealtimeClient(server.url)
        await client.connect(http)
        await asyncio.wait_for(client.wait_for_type("session.created"), 10)
        done = client.wait_for_type("response.done")
        sent = await client.mic.play(np.concatenate((librivox(clip), silence(0.3))), 16000)
        response = (await asyncio.wait_for(done, 90))["response"]
        (heard,) = client.of_type("conversation.item.input_audio_transcription.completed")
        first_sound = client.received.first_sound_after(sent)
        await client.hangup(http)
        return heard["transcript"], response, first_sound

    results = await asyncio.gather(*(caller(clip) for clip in clips))
    for clip, (transcript, response, first_sound) in zip(clips, results, strict=True):
        assert heard_as_its_own(clip, transcript, clips), (clip, transcript)
        assert response["status"] == "completed", response.get("status_details")
        assert response["output"][0]["content"][0]["transcript"].strip()
        assert first_sound is not None
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


async def test_a_flood_of_events_is_throttled_in_its_own_session_only(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory()
    flooder, talker = RealtimeClient(server.url), RealtimeClient(server.url)
    for client in (flooder, talker):
        await client.connect(http)
        await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    done = talker.wait_for_type("response.done")
    talking = talker.mic.play(np.concatenate((librivox("0930"), silence(0.3))), 16000)
    for _ in range(1000):
        flooder.send({"type": "session.update", "session": {"type": "realtime"}})
    limited = await asyncio.wait_for(
        flooder.wait_for(lambda e: e.get("error", {}).get("code") == "rate_limited"), 10
    )
    assert "events a second" in limited["error"]["message"]
    # The other caller is answered as usual, meanwhile.
    await talking
    assert (await asyncio.wait_for(done, 60))["response"]["status"] == "completed"
    # Throttled, not dropped: the flooder's own events work again afterwards,
    # and it was told once a second at most, not once per dropped event.
    updated = len(flooder.of_type("session.updated"))
    assert 200 <= updated < 1000
    errors = [e for e in flooder.of_type("error") if e["error"]["code"] == "rate_limited"]
    assert 1 <= len(errors) <= 5
    await asyncio.sleep(1.0)  # real time: the rate limit's second passes
    again = flooder.wait_for_type("session.updated", after=len(flooder.events))
    flooder.send({"type": "session.update", "session": {"type": "realtime"}})
    await asyncio.wait_for(again, 5)
    for client in (flooder, talker):
        await client.hangup(http)
