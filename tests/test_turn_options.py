"""Turn detection's create_response and interrupt_response over a real
WebRTC call (speech sent as appended audio, real STT, a scripted LLM)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from tests.realtime_events import appended_audio, typed
from tests.scripted_call import answered, ask, call, peer
from voice_agent.client import RealtimeClient
from voice_agent.testing.audio_data import librivox, silence
from voice_agent.testing.scripted_llm import Script, ScriptedLlmServer, chat_text

pytestmark = pytest.mark.e2e
__all__ = ["call", "peer"]  # the fixtures
SPOKEN_TURN = np.concatenate((librivox("0930"), silence(1.0)))


def turns(create_response: bool, interrupt_response: bool) -> dict[str, object]:
    detection = {
        "type": "server_vad",
        "create_response": create_response,
        "interrupt_response": interrupt_response,
    }
    return {
        "type": "session.update",
        "session": {"audio": {"input": {"turn_detection": detection}}},
    }


async def test_without_create_response_a_turn_is_heard_but_not_answered(
    call: RealtimeClient, peer: ScriptedLlmServer
) -> None:
    client = call
    assert (await ask(client, turns(False, True)))["type"] == "session.updated"
    transcribed = client.wait_for_type("conversation.item.input_audio_transcription.completed")
    for event in appended_audio(SPOKEN_TURN):
        client.send(event)
    heard = await asyncio.wait_for(transcribed, 15)
    assert heard["transcript"].strip()
    await asyncio.sleep(0.5)  # real time: a while in which no reply may start
    assert not client.of_type("response.created")
    assert peer.requests == []
    # The turn is in the conversation: the next reply asked for sees it.
    peer.add(Script(chat_text("Yes.")))
    await answered(client)
    assert peer.bodies()[0]["messages"][-1] == {"role": "user", "content": heard["transcript"]}


@pytest.mark.slow
async def test_without_interrupt_response_speech_does_not_cut_the_reply(
    call: RealtimeClient, peer: ScriptedLlmServer
) -> None:
    client = call
    assert (await ask(client, turns(True, False)))["type"] == "session.updated"
    peer.add(Script(chat_text("One, two, three, four, five, six, seven, eight, nine, ten.")))
    await ask(client, typed("Count to ten."))
    mark = len(client.events)
    client.send({"type": "response.create"})
    await asyncio.wait_for(client.wait_for_type("output_audio_buffer.started", after=mark), 15)
    transcribed = client.wait_for_type(
        "conversation.item.input_audio_transcription.completed", after=mark
    )
    for event in appended_audio(SPOKEN_TURN):  # the user talks over it
        client.send(event)
    await asyncio.wait_for(transcribed, 15)
    done = await asyncio.wait_for(client.wait_for_type("response.done", after=mark), 30)
    assert done["response"]["status"] == "completed"
    kinds = [e["type"] for e in client.events[mark:]]
    assert "input_audio_buffer.speech_started" in kinds
    assert "output_audio_buffer.cleared" not in kinds
    # The turn that ended while the reply was given is not answered over it,
    # and follows that reply in the history.
    assert kinds.count("response.created") == 1
    assert len(peer.requests) == 1
    peer.add(Script(chat_text("Yes.")))
    await answered(client)
    sent = [(m["role"], m["content"]) for m in peer.bodies()[1]["messages"]]
    assert [role for role, _ in sent[-3:]] == ["user", "assistant", "user"]
    assert sent[-3][1] == "Count to ten."


async def test_push_to_talk_commit_then_response_create_answers_that_turn(
    call: RealtimeClient, peer: ScriptedLlmServer
) -> None:
    """Sent back to back, as push-to-talk clients do: the reply waits for
    the committed turn's transcript, and the LLM is asked about it."""
    client = call
    push_to_talk = {"audio": {"input": {"turn_detection": None}}}
    assert (await ask(client, {"type": "session.update", "session": push_to_talk}))["type"] == (
        "session.updated"
    )
    peer.add(Script(chat_text("Yes.")))
    for event in appended_audio(SPOKEN_TURN):
        client.send(event)
    client.send({"type": "input_audio_buffer.commit"})
    client.send({"type": "response.create"})
    done = await asyncio.wait_for(client.wait_for_type("response.done"), 20)
    assert done["response"]["status"] == "completed"
    (heard,) = client.of_type("conversation.item.input_audio_transcription.completed")
    assert heard["transcript"].strip()
    assert peer.bodies()[0]["messages"][-1] == {"role": "user", "content": heard["transcript"]}
    kinds = [e["type"] for e in client.events]
    assert kinds.index("conversation.item.input_audio_transcription.completed") < kinds.index(
        "response.created"
    )
