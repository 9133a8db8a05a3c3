"""response.create's options and text-only sessions over a real WebRTC call:
out-of-band replies (conversation "none") with their own input and the
client's metadata leave the history alone; output_modalities ["text"] gives
text events and no audio. The scripted LLM server records what it is sent."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.realtime_events import typed
from tests.scripted_call import answered, ask, call, history, peer, refused
from voice_agent.client import RealtimeClient
from voice_agent.testing.scripted_llm import Script, ScriptedLlmServer, chat_text

pytestmark = pytest.mark.e2e
__all__ = ["call", "peer"]  # the fixtures


async def test_an_out_of_band_response_sees_its_input_and_leaves_the_history_alone(
    call: RealtimeClient, peer: ScriptedLlmServer
) -> None:
    client = call
    peer.add(Script(chat_text("It is about the weather.")), Script(chat_text("Sunny.")))
    added = await ask(client, typed("What will the weather be like?"))
    question_id = added["item"]["id"]

    mark = len(client.events)
    oob = await answered(
        client,
        {
            "conversation": "none",
            "metadata": {"purpose": "topic"},
            "output_modalities": ["text"],
            "instructions": "Name the topic.",
            "input": [
                {"type": "item_reference", "id": question_id},
                {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "What is this about?"}],
                },
            ],
        },
    )
    assert oob["status"] == "completed"
    assert oob["output"][0]["content"] == [
        {"type": "output_text", "text": "It is about the weather."}
    ]
    assert oob["metadata"]["purpose"] == "topic"  # with the turn's latency record
    (created,) = [e for e in client.events[mark:] if e["type"] == "response.created"]
    assert created["response"]["metadata"] == {"purpose": "topic"}
    kinds = [e["type"] for e in client.events[mark:]]
    assert "conversation.item.added" not in kinds and "conversation.item.done" not in kinds
    assert history(peer.bodies()[0]) == [
        ("system", "Name the topic."),
        ("user", "What will the weather be like?"),
        ("user", "What is this about?"),
    ]
    # Not in the conversation: it cannot be retrieved, and the next reply never sees it.
    missing = await ask(
        client, {"type": "conversation.item.retrieve", "item_id": oob["output"][0]["id"]}
    )
    assert missing["error"]["code"] == "item_not_found"
    second = await answered(client)
    assert second["metadata"].get("purpose") is None
    sent = [m for m in history(peer.bodies()[1]) if m[0] != "system"]
    assert sent == [("user", "What will the weather be like?")]


async def test_text_only_replies_have_text_events_and_no_audio(
    call: RealtimeClient, peer: ScriptedLlmServer
) -> None:
    client = call
    updated = await ask(
        client, {"type": "session.update", "session": {"output_modalities": ["text"]}}
    )
    assert updated["session"]["output_modalities"] == ["text"]
    peer.add(Script(chat_text("Plain ", "text, ", "no sound.")))
    await ask(client, typed("Say something."))
    mark = len(client.events)
    asked_at = time.monotonic()
    response = await answered(client)
    assert response["status"] == "completed"
    assert response["output_modalities"] == ["text"]
    assert response["output"][0]["content"] == [
        {"type": "output_text", "text": "Plain text, no sound."}
    ]
    kinds = [e["type"] for e in client.events[mark:]]
    deltas = [e["delta"] for e in client.events[mark:] if e["type"] == "response.output_text.delta"]
    assert "".join(deltas) == "Plain text, no sound."
    (done,) = [e for e in client.events[mark:] if e["type"] == "response.output_text.done"]
    assert done["text"] == "Plain text, no sound."
    for audio_event in (
        "response.output_audio_transcript.delta",
        "response.output_audio.done",
        "output_audio_buffer.started",
    ):
        assert audio_event not in kinds
    assert "tts_first_audio_ms" not in response["metadata"]  # nothing was synthesised
    await asyncio.sleep(0.5)  # real time: a while in which no sound may arrive
    assert client.received.first_sound_after(asked_at) is None
    # It is still in the conversation, as text.
    retrieved = await ask(
        client, {"type": "conversation.item.retrieve", "item_id": response["output"][0]["id"]}
    )
    assert retrieved["item"]["content"][0]["text"] == "Plain text, no sound."


REFUSED_OPTIONS = [
    ({"conversation": "conv_other"}, "response.conversation"),
    ({"metadata": {"k": 5}}, "response.metadata"),
    ({"metadata": {str(i): "v" for i in range(17)}}, "response.metadata"),
    ({"input": [{"type": "item_reference", "id": "item_nope"}]}, "response.input[0].id"),
    ({"input": [{"type": "function_call"}]}, "response.input[0].type"),
    (
        {"input": [{"type": "message", "role": "user", "content": [{"type": "input_image"}]}]},
        "response.input[0].content[0]",
    ),
    ({"output_modalities": ["text", "audio"]}, "response.output_modalities"),
    ({"audio": {"output": {"voice": "alloy"}}}, "response.audio.output.voice"),
    ({"prompt": {"id": "pmpt_1"}}, "response.prompt"),
    ({"temperature": 0.2}, "response.temperature"),
]


async def test_response_options_this_server_cannot_honour_are_refused(
    call: RealtimeClient, peer: ScriptedLlmServer
) -> None:
    for response, param in REFUSED_OPTIONS:
        error = await ask(call, {"type": "response.create", "response": response})
        assert error["type"] == "error" and error["error"]["param"] == param, (response, error)
    assert peer.requests == []


async def test_an_input_of_references_holds_no_more_words_than_an_event(
    call: RealtimeClient, peer: ScriptedLlmServer
) -> None:
    # One item referenced again and again made an LLM request as large as
    # the item times the references, from an event of a few hundred bytes.
    item = typed("word " * 12_000)  # 60,000 characters
    item["item"]["id"] = "item_long"
    added = call.wait_for_type("conversation.item.done", after=len(call.events))
    call.send(item)
    await asyncio.wait_for(added, 5)
    references = [{"type": "item_reference", "id": "item_long"}] * 5
    error = await refused(
        call, {"type": "response.create", "response": {"conversation": "none", "input": references}}
    )
    assert error["code"] == "input_too_large" and error["param"] == "response.input", error
    assert peer.requests == []
