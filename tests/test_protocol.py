"""The data-channel protocol: bad client events get error events, never a crash."""

from __future__ import annotations

import json
from typing import Any

import pytest

from voice_agent.engine import Engine
from voice_agent.realtime.protocol import RealtimeProtocol
from voice_agent.rtc.outbound import PacedAudioTrack
from voice_agent.session.session import VoiceSession

# A tool schema nested past the limit: once taken, every echo of the session
# and every LLM request with the tools could fail to serialize.
DEEP_TOOLS = json.dumps(
    {
        "type": "session.update",
        "session": {"tools": [{"type": "function", "name": "f", "parameters": {}}]},
    }
).replace("{}", '{"a": ' * 100 + "1" + "}" * 100)


@pytest.fixture
def wire(engine: Engine) -> tuple[RealtimeProtocol, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    track = PacedAudioTrack()
    holder: dict[str, RealtimeProtocol] = {}
    assert engine.models is not None
    session = VoiceSession(
        engine.models,
        engine.session_config(),
        track,
        lambda event: holder["p"].on_session_event(event),
    )
    protocol = RealtimeProtocol(session, sent.append, "test-model", "joe", 60)
    holder["p"] = protocol
    return protocol, sent


@pytest.mark.parametrize(
    ("raw", "code"),
    [
        ("not json", "invalid_json"),
        (b"\xff\xfe", "invalid_json"),
        ("[1, 2]", "invalid_event"),
        ('{"no": "type"}', "invalid_event"),
        ('{"type": "does.not.exist"}', "unknown_event"),
        ('{"type": "session.update"}', "invalid_value"),
        ('{"type": "session.update", "session": {"instructions": 5}}', "invalid_type"),
        (
            '{"type": "session.update", "session": {"audio": {"input": {"turn_detection":'
            ' {"silence_duration_ms": "long"}}}}}',
            "invalid_value",
        ),
        ('{"type": "response.cancel"}', "response_cancel_not_active"),
        ('{"type": "response.cancel", "response_id": {"id": 1}}', "invalid_type"),
        ('{"type": "response.cancel", "response_id": ["resp_1"]}', "invalid_type"),
        ("x" * 300_000, "event_too_large"),
        ("[" * 5000 + "]" * 5000, "invalid_json"),
        ('{"type": "session.update", "session": {"instructions": NaN}}', "invalid_json"),
        (DEEP_TOOLS, "invalid_json"),
    ],
)
async def test_bad_client_events_get_an_error_event(
    wire: tuple[RealtimeProtocol, list[dict[str, Any]]], raw: str | bytes, code: str
) -> None:
    protocol, sent = wire
    protocol.on_client_message(raw)
    assert len(sent) == 1
    event = sent[0]
    assert event["type"] == "error" and event["event_id"]
    assert event["error"]["code"] == code
    assert event["error"]["message"]


async def test_a_refused_event_changes_nothing(
    wire: tuple[RealtimeProtocol, list[dict[str, Any]]],
) -> None:
    protocol, sent = wire
    protocol.on_client_message(DEEP_TOOLS)
    assert sent[0]["error"]["code"] == "invalid_json"
    assert "nested more than" in sent[0]["error"]["message"]
    assert protocol.session.client_tools == []


async def test_the_client_event_id_is_echoed_in_errors(
    wire: tuple[RealtimeProtocol, list[dict[str, Any]]],
) -> None:
    protocol, sent = wire
    protocol.on_client_message(json.dumps({"type": "nope", "event_id": "evt_42"}))
    assert sent[0]["error"]["event_id"] == "evt_42"


async def test_session_update_is_applied_and_acknowledged(
    wire: tuple[RealtimeProtocol, list[dict[str, Any]]],
) -> None:
    protocol, sent = wire
    protocol.on_client_message(
        json.dumps(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "instructions": "Talk like a pirate.",
                    "audio": {
                        "input": {
                            "turn_detection": {"type": "server_vad", "silence_duration_ms": 800}
                        }
                    },
                },
            }
        )
    )
    (updated,) = sent
    assert updated["type"] == "session.updated"
    session = updated["session"]
    assert session["instructions"] == "Talk like a pirate."
    assert session["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 800
    assert protocol.session.conversation.messages_for("hi")[0].content == "Talk like a pirate."


async def test_session_created_describes_the_session(
    wire: tuple[RealtimeProtocol, list[dict[str, Any]]],
) -> None:
    protocol, sent = wire
    protocol.send_session_created()
    (created,) = sent
    assert created["type"] == "session.created"
    assert created["session"]["type"] == "realtime"
    assert created["session"]["object"] == "realtime.session"
    assert created["session"]["output_modalities"] == ["audio"]
