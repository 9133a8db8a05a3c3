"""Client events for tools and typed turns: session.update tools,
conversation.item.create, response.create; bad ones get error events."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from voice_agent.backends.base import ChatMessage, ToolCall, ToolSpec
from voice_agent.engine import Engine
from voice_agent.realtime.protocol import RealtimeProtocol
from voice_agent.rtc.outbound import PacedAudioTrack
from voice_agent.session.session import VoiceSession
from voice_agent.session.tools import ToolRegistry

Wire = tuple[RealtimeProtocol, list[dict[str, Any]]]


@pytest.fixture
async def wire(engine: Engine) -> Any:
    sent: list[dict[str, Any]] = []
    holder: dict[str, RealtimeProtocol] = {}
    assert engine.models is not None
    session = VoiceSession(
        engine.models,
        engine.session_config(),
        PacedAudioTrack(),
        lambda event: holder["p"].on_session_event(event),
    )
    protocol = RealtimeProtocol(session, sent.append, "test-model", "joe", 60)
    holder["p"] = protocol
    yield protocol, sent
    await session.close()


def send(protocol: RealtimeProtocol, event: dict[str, Any]) -> None:
    protocol.on_client_message(json.dumps(event))


TOOL = {
    "type": "function",
    "name": "get_time",
    "description": "The time now.",
    "parameters": {"type": "object", "properties": {}},
}


async def test_session_update_declares_tools_choice_and_token_cap(wire: Wire) -> None:
    protocol, sent = wire
    send(
        protocol,
        {
            "type": "session.update",
            "session": {
                "tools": [TOOL],
                "tool_choice": {"type": "function", "name": "get_time"},
                "max_output_tokens": 42,
            },
        },
    )
    (updated,) = sent
    assert updated["type"] == "session.updated"
    assert updated["session"]["tools"] == [TOOL]
    assert updated["session"]["tool_choice"] == {"type": "function", "name": "get_time"}
    assert updated["session"]["max_output_tokens"] == 42
    session = protocol.session
    assert session.client_tools == [
        ToolSpec("get_time", "The time now.", {"type": "object", "properties": {}})
    ]
    assert session.config.reply.max_tokens == 42


async def test_no_client_raises_the_servers_token_cap(wire: Wire) -> None:
    protocol, sent = wire  # --llm-max-tokens 60 here
    send(protocol, {"type": "session.update", "session": {"max_output_tokens": 4096}})
    assert sent[-1]["session"]["max_output_tokens"] == 60
    assert protocol.session.config.reply.max_tokens == 60
    send(protocol, {"type": "session.update", "session": {"max_output_tokens": "inf"}})
    assert sent[-1]["session"]["max_output_tokens"] == 60


async def test_typed_messages_and_tool_outputs_join_the_conversation(wire: Wire) -> None:
    protocol, sent = wire
    send(
        protocol,
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "What time is it?"}],
            },
        },
    )
    # The model called get_time (a reply handed the call to the client).
    call = ChatMessage("assistant", "", tool_calls=(ToolCall("call_1", "get_time", "{}"),))
    protocol.session.conversation.add(call)
    send(
        protocol,
        {
            "type": "conversation.item.create",
            "item": {"type": "function_call_output", "call_id": "call_1", "output": "noon"},
        },
    )
    assert [e["type"] for e in sent] == ["conversation.item.added", "conversation.item.done"] * 2
    assert sent[0]["item"]["content"] == [{"type": "input_text", "text": "What time is it?"}]
    assert sent[2]["previous_item_id"] == sent[0]["item"]["id"]
    assert protocol.session.conversation.history == [
        ChatMessage("user", "What time is it?"),
        call,
        ChatMessage("tool", "noon", tool_call_id="call_1"),
    ]


async def test_an_output_for_a_call_never_made_or_already_answered_is_refused(
    wire: Wire,
) -> None:
    """An orphan tool message would make every later chat request a 400."""
    protocol, sent = wire
    call = ChatMessage("assistant", "", tool_calls=(ToolCall("call_1", "get_time", "{}"),))
    protocol.session.conversation.add(call)
    for call_id in ("call_404", "call_1", "call_1"):
        send(
            protocol,
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": call_id, "output": "noon"},
            },
        )
    errors = [e["error"] for e in sent if e["type"] == "error"]
    assert [(e["code"], e["param"]) for e in errors] == [("invalid_value", "item.call_id")] * 2
    assert "call_404" in errors[0]["message"]
    assert protocol.session.conversation.history == [
        call,
        ChatMessage("tool", "noon", tool_call_id="call_1"),
    ]


async def test_a_second_response_create_while_one_is_active_is_refused(wire: Wire) -> None:
    protocol, sent = wire
    send(protocol, {"type": "response.create"})
    send(protocol, {"type": "response.create"})
    errors = [e for e in sent if e["type"] == "error"]
    assert [e["error"]["code"] for e in errors] == ["conversation_already_has_active_response"]
    assert protocol.session.cancel_response()


@pytest.mark.parametrize(
    ("event", "code"),
    [
        ({"type": "session.update", "session": {"tools": "get_time"}}, "invalid_value"),
        ({"type": "session.update", "session": {"tools": [{"type": "mcp"}]}}, "invalid_value"),
        ({"type": "session.update", "session": {"tools": [{"name": 5}]}}, "invalid_value"),
        ({"type": "session.update", "session": {"tools": [{"name": "a b"}]}}, "invalid_value"),
        ({"type": "session.update", "session": {"tool_choice": "sometimes"}}, "invalid_value"),
        ({"type": "session.update", "session": {"max_output_tokens": 0}}, "invalid_value"),
        ({"type": "conversation.item.create"}, "invalid_value"),
        ({"type": "conversation.item.create", "item": {"type": "image"}}, "invalid_value"),
        (
            {"type": "conversation.item.create", "item": {"type": "function_call_output"}},
            "invalid_value",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": "c", "output": 5},
            },
            "invalid_type",
        ),
        (
            {
                "type": "conversation.item.create",
                "item": {"type": "message", "role": "user", "content": []},
            },
            "invalid_value",
        ),
        ({"type": "response.create", "response": {"instructions": 3}}, "invalid_type"),
        ({"type": "response.create", "response": {"max_output_tokens": "x"}}, "invalid_value"),
    ],
)
async def test_bad_tool_and_item_events_get_an_error_and_change_nothing(
    wire: Wire, event: dict[str, Any], code: str
) -> None:
    protocol, sent = wire
    before = protocol.session.conversation.history
    send(protocol, event)
    (error,) = sent
    assert error["type"] == "error" and error["error"]["code"] == code
    assert protocol.session.conversation.history == before
    assert protocol.session.client_tools == []


async def test_a_client_tool_named_like_a_server_tool_or_twice_is_refused(engine: Engine) -> None:
    """Both would be offered to the model, and a call could only reach one of them."""
    assert engine.models is not None
    sent: list[dict[str, Any]] = []
    registry = ToolRegistry.from_module("tests.tools_example", 1.0)
    config = dataclasses.replace(engine.session_config(), tools=registry)
    session = VoiceSession(engine.models, config, PacedAudioTrack(), lambda event: None)
    protocol = RealtimeProtocol(session, sent.append, "test-model", "joe", 60)
    try:
        clash = {**TOOL, "name": "get_weather"}  # a server tool's name
        send(protocol, {"type": "session.update", "session": {"tools": [TOOL, clash]}})
        send(protocol, {"type": "session.update", "session": {"tools": [TOOL, TOOL]}})
        errors = [e["error"] for e in sent]
        assert [(e["code"], e["param"]) for e in errors] == [
            ("invalid_value", "session.tools[1].name"),
        ] * 2
        assert "server tool" in errors[0]["message"]
        assert session.client_tools == []
        send(protocol, {"type": "session.update", "session": {"tools": [TOOL]}})
        assert sent[-1]["type"] == "session.updated"
        assert [t.name for t in session.tools] == [
            *(t.name for t in registry.specs),
            "get_time",
        ]
    finally:
        await session.close()


async def test_deleting_a_function_output_reopens_its_call(wire: Wire) -> None:
    protocol, sent = wire
    call = ChatMessage("assistant", "", tool_calls=(ToolCall("call_1", "get_time", "{}"),))
    protocol.session.conversation.add(call)
    output = {"type": "function_call_output", "call_id": "call_1", "output": "noon"}
    send(protocol, {"type": "conversation.item.create", "item": {"id": "item_out", **output}})
    assert not protocol.session.conversation.has_open_call("call_1")
    send(protocol, {"type": "conversation.item.delete", "item_id": "item_out"})
    assert sent[-1] == {**sent[-1], "type": "conversation.item.deleted", "item_id": "item_out"}
    assert protocol.session.conversation.history == [call]
    # The client may answer the call again.
    send(protocol, {"type": "conversation.item.create", "item": {"id": "item_out2", **output}})
    assert sent[-1]["type"] == "conversation.item.done"
    assert protocol.session.conversation.history[-1].tool_call_id == "call_1"
