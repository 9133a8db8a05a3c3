"""Barge-in that a cough does not set off, over a real WebRTC call (real VAD,
STT and TTS, a scripted LLM): speech over a reply pauses it; a burst with no
words lets it go on, unanswered; a short word or long speech cancels it."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from tests.realtime_events import appended_audio, typed
from tests.scripted_call import ask, call, peer
from voice_agent.client import RealtimeClient
from voice_agent.session.barge_in import is_backchannel
from voice_agent.testing.audio_data import librivox, noise_burst, silence, telephone_prompt
from voice_agent.testing.scripted_llm import Script, ScriptedLlmServer, chat_text

pytestmark = pytest.mark.e2e
__all__ = ["call", "peer"]  # the fixtures
LONG_REPLY = "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve."


def test_backchannels_are_told_from_words_that_take_the_turn() -> None:
    for said in ("Mm-hmm.", "Yeah, yeah.", "Uh-huh", "Okay, got it!", "I see.", ""):
        assert is_backchannel(said), said
    for said in ("No.", "Stop.", "Wait, what?", "Yes please", "I got it wrong"):
        assert not is_backchannel(said), said


async def spoken_over_a_reply(
    client: RealtimeClient, peer: ScriptedLlmServer, burst: np.ndarray, answered: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Start a long reply, speak ``burst`` over it once it sounds; the
    reply's response.done and every event from its start: up to the start
    of the reply to the burst when it is ``answered``, else up to a second
    after the reply ended."""
    peer.add(Script(chat_text(LONG_REPLY)))
    peer.add(Script(chat_text("Alright.")))  # for a burst that is answered
    await ask(client, typed("Count to twelve."))
    mark = len(client.events)
    client.send({"type": "response.create"})
    started = await asyncio.wait_for(
        client.wait_for_type("output_audio_buffer.started", after=mark), 15
    )
    done = client.wait_for(
        lambda e: e["type"] == "response.done" and e["response"]["id"] == started["response_id"],
        after=mark,
    )
    await asyncio.sleep(0.8)  # the caller hears some of it
    for event in appended_audio(np.concatenate((burst, silence(1.0)))):
        client.send(event)
    finished = await asyncio.wait_for(done, 30)
    if answered:

        def the_bursts_reply(event: dict[str, Any]) -> bool:
            kind, response_id = event["type"], event.get("response", {}).get("id")
            return bool(kind == "response.created" and response_id != started["response_id"])

        await asyncio.wait_for(client.wait_for(the_bursts_reply, after=mark), 30)
    else:
        # Real time: a second in which a reply to the burst would have begun.
        await asyncio.sleep(1.0)
    return finished["response"], client.events[mark:]


@pytest.mark.slow
async def test_a_cough_pauses_the_reply_and_it_goes_on(
    call: RealtimeClient, peer: ScriptedLlmServer
) -> None:
    response, events = await spoken_over_a_reply(call, peer, noise_burst(200, -25.0), False)
    kinds = [e["type"] for e in events]
    assert "input_audio_buffer.speech_started" in kinds  # the VAD took it for speech
    assert response["status"] == "completed", response
    assert "output_audio_buffer.cleared" not in kinds
    assert kinds.count("response.created") == 1  # the cough is not answered
    spoken = [e for e in events if e["type"] == "response.output_audio_transcript.done"]
    assert spoken and "twelve" in spoken[0]["transcript"].lower()  # played to the end


async def test_a_short_no_takes_the_turn(call: RealtimeClient, peer: ScriptedLlmServer) -> None:
    response, events = await spoken_over_a_reply(call, peer, telephone_prompt("no"), True)
    assert response["status"] == "cancelled", response
    assert response["status_details"]["reason"] == "turn_detected"
    heard = [
        e["transcript"]
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    assert [h.strip(" .!").lower() for h in heard] == ["no"]
    assert [e["type"] for e in events].count("response.created") == 2  # "no" is answered


async def test_long_speech_cancels_the_reply_before_it_ends(
    call: RealtimeClient, peer: ScriptedLlmServer
) -> None:
    response, events = await spoken_over_a_reply(call, peer, librivox("0930"), True)
    assert response["status"] == "cancelled", response
    kinds = [e["type"] for e in events]
    # Cancelled on hearing 500 ms of speech, before the speech (4 s) ended.
    assert kinds.index("output_audio_buffer.cleared") < kinds.index(
        "input_audio_buffer.speech_stopped"
    )
