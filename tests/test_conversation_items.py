"""conversation.item.retrieve / delete / truncate over a real WebRTC call:
the items come back as the server holds them, and the history the LLM is
sent next (recorded by a scripted LLM server) follows every change."""

from __future__ import annotations

import asyncio

import pytest

from tests.realtime_events import typed
from tests.scripted_call import answered, ask, call, history, peer, refused
from voice_agent.client import RealtimeClient
from voice_agent.testing.scripted_llm import Script, ScriptedLlmServer, chat_text

pytestmark = pytest.mark.e2e
__all__ = ["call", "peer"]  # the fixtures
REPLY = "One, two, three, four, five, six, seven, eight."


@pytest.mark.slow
async def test_items_are_retrieved_deleted_and_truncated_and_the_llm_sees_it(
    call: RealtimeClient, peer: ScriptedLlmServer
) -> None:
    client = call
    peer.add(Script(chat_text(REPLY)), Script(chat_text("Yes.")), Script(chat_text("Yes.")))
    added = await ask(client, typed("Count to eight."))
    question_id = added["item"]["id"]
    mark = len(client.events)
    client.send({"type": "response.create"})
    playing = await asyncio.wait_for(client.wait_for_type("output_audio_buffer.started"), 15)
    (in_progress,) = [
        e["item"]["id"]
        for e in client.events[mark:]
        if e["type"] == "conversation.item.added" and e["item"]["role"] == "assistant"
    ]
    for event in (
        {"type": "conversation.item.delete", "item_id": in_progress},
        {
            "type": "conversation.item.truncate",
            "item_id": in_progress,
            "content_index": 0,
            "audio_end_ms": 0,
        },
        {"type": "response.cancel", "response_id": "resp_other"},
    ):
        error = await refused(client, event)
        assert error["code"] in ("item_in_progress", "response_cancel_not_active"), error
    assert playing["response_id"]
    first = (await asyncio.wait_for(client.wait_for_type("response.done", after=mark), 30))[
        "response"
    ]
    assert first["status"] == "completed"
    answer_id = first["output"][0]["id"]
    spoken = first["output"][0]["content"][0]["transcript"]

    # Retrieved as the server holds them.
    retrieved = await ask(client, {"type": "conversation.item.retrieve", "item_id": question_id})
    assert retrieved["type"] == "conversation.item.retrieved"
    assert retrieved["item"]["content"] == [{"type": "input_text", "text": "Count to eight."}]
    retrieved = await ask(client, {"type": "conversation.item.retrieve", "item_id": answer_id})
    assert retrieved["item"]["role"] == "assistant"
    assert retrieved["item"]["content"][0]["transcript"] == spoken

    # Truncated where the listener stopped: half way through its audio.
    started = client.event_times[
        client.events.index(client.of_type("output_audio_buffer.started")[0])
    ]
    stopped = client.event_times[
        client.events.index(client.of_type("output_audio_buffer.stopped")[0])
    ]
    half_ms = int((stopped - started) * 1000 / 2)
    too_far = await ask(
        client,
        {
            "type": "conversation.item.truncate",
            "item_id": answer_id,
            "content_index": 0,
            "audio_end_ms": 60_000,
        },
    )
    assert too_far["type"] == "error" and too_far["error"]["param"] == "audio_end_ms"
    truncated = await ask(
        client,
        {
            "type": "conversation.item.truncate",
            "item_id": answer_id,
            "content_index": 0,
            "audio_end_ms": half_ms,
        },
    )
    assert truncated == {
        **truncated,
        "type": "conversation.item.truncated",
        "audio_end_ms": half_ms,
    }
    retrieved = await ask(client, {"type": "conversation.item.retrieve", "item_id": answer_id})
    kept = retrieved["item"]["content"][0]["transcript"]
    assert kept and spoken.startswith(kept) and len(kept) < len(spoken), (kept, spoken)

    await answered(client)
    assert history(peer.bodies()[1])[-2:] == [("user", "Count to eight."), ("assistant", kept)]

    # Deleted: the question goes from the history (and can no longer be retrieved).
    deleted = await ask(client, {"type": "conversation.item.delete", "item_id": question_id})
    assert deleted == {**deleted, "type": "conversation.item.deleted", "item_id": question_id}
    gone = await ask(client, {"type": "conversation.item.retrieve", "item_id": question_id})
    assert gone["type"] == "error" and gone["error"]["code"] == "item_not_found"
    await answered(client)
    third = [m for m in history(peer.bodies()[2]) if m[0] != "system"]
    assert ("user", "Count to eight.") not in third
    assert third[0] == ("assistant", kept)  # the truncated answer is still there


async def test_unknown_items_and_bad_truncations_are_refused(
    call: RealtimeClient, peer: ScriptedLlmServer
) -> None:
    client = call
    added = await ask(client, typed("Hello."))
    user_id = added["item"]["id"]
    cases = [
        ({"type": "conversation.item.retrieve", "item_id": "item_nope"}, "item_id"),
        ({"type": "conversation.item.delete"}, "item_id"),
        (
            {
                "type": "conversation.item.truncate",
                "item_id": user_id,
                "content_index": 0,
                "audio_end_ms": 0,
            },
            "item_id",  # only an assistant's audio can be truncated
        ),
        (
            {
                "type": "conversation.item.truncate",
                "item_id": user_id,
                "content_index": 0,
                "audio_end_ms": -5,
            },
            "audio_end_ms",
        ),
        (
            {
                "type": "conversation.item.truncate",
                "item_id": user_id,
                "content_index": 2,
                "audio_end_ms": 0,
            },
            "content_index",
        ),
    ]
    for event, param in cases:
        error = await ask(client, event)
        assert error["type"] == "error" and error["error"]["param"] == param, (event, error)
    assert peer.requests == []
