"""session.update in full: what OpenAI's clients send is applied (turn
detection, transcription, output modalities, the voice), and anything this
server cannot honour is refused with an error naming the parameter, leaving
the session as it was."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

from tests.test_protocol_tools import Wire, wire
from voice_agent.realtime.errors import ClientEventError
from voice_agent.realtime.session_config import EAGERNESS_SILENCE_MS
from voice_agent.session.input import TurnDetection

__all__ = ["wire"]  # the fixture


def update(protocol: Any, session: dict[str, Any]) -> None:
    protocol.on_client_message(json.dumps({"type": "session.update", "session": session}))


# What OpenAI's agents SDK sends when it connects (its defaults), with our voice.
AGENTS_SDK_SESSION = {
    "type": "realtime",
    "model": "gpt-realtime",
    "instructions": "Be brief.",
    "output_modalities": ["audio"],
    "audio": {
        "input": {
            "format": {"type": "audio/pcm", "rate": 24000},
            "noise_reduction": None,
            "transcription": {"model": "gpt-4o-mini-transcribe"},
            "turn_detection": {"type": "semantic_vad", "eagerness": "high"},
        },
        "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": "joe", "speed": 1},
    },
    "tool_choice": "auto",
    "tools": [],
    "tracing": "auto",
}


async def test_an_openai_sdk_session_is_accepted(wire: Wire) -> None:
    protocol, sent = wire
    update(protocol, AGENTS_SDK_SESSION)
    (updated,) = sent
    assert updated["type"] == "session.updated", updated
    session = updated["session"]
    assert session["instructions"] == "Be brief."
    assert session["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad",
        "eagerness": "high",
        "create_response": True,
        "interrupt_response": True,
    }
    detection = protocol.session.turn_detection
    assert detection is not None and detection.silence_ms == EAGERNESS_SILENCE_MS["high"]
    # Our STT and voice are reported, whatever OpenAI name stood for them.
    assert session["audio"]["input"]["transcription"]["model"] == protocol.session.models.stt.name
    assert session["audio"]["output"]["voice"] == "joe"


async def test_server_vad_settings_push_to_talk_text_output_and_no_transcription(
    wire: Wire,
) -> None:
    protocol, sent = wire
    update(
        protocol,
        {
            "audio": {
                "input": {
                    "turn_detection": {
                        "type": "server_vad",
                        "threshold": 0.7,
                        "prefix_padding_ms": 200,
                        "silence_duration_ms": 900,
                        "create_response": False,
                        "interrupt_response": False,
                        "idle_timeout_ms": None,
                    }
                }
            }
        },
    )
    assert protocol.session.turn_detection == TurnDetection(
        silence_ms=900,
        threshold=0.7,
        preroll_ms=200,
        create_response=False,
        interrupt_response=False,
    )
    turn = sent[-1]["session"]["audio"]["input"]["turn_detection"]
    assert turn == {
        "type": "server_vad",
        "threshold": 0.7,
        "prefix_padding_ms": 200,
        "silence_duration_ms": 900,
        "idle_timeout_ms": None,
        "create_response": False,
        "interrupt_response": False,
    }
    # A new turn_detection object replaces the old one: what it leaves out is the default.
    update(protocol, {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}})
    defaults = protocol.session.config.turn
    assert protocol.session.turn_detection == TurnDetection(
        defaults.turn_silence_ms, defaults.threshold, defaults.preroll_ms
    )
    update(
        protocol,
        {
            "output_modalities": ["text"],
            "audio": {"input": {"turn_detection": None, "transcription": None}},
        },
    )
    session = sent[-1]["session"]
    assert session["output_modalities"] == ["text"]
    assert session["audio"]["input"]["turn_detection"] is None
    assert session["audio"]["input"]["transcription"] is None
    assert protocol.session.turn_detection is None
    assert protocol.session.audio_output is False


REFUSED = [
    ({"voice": "alloy"}, "session.voice"),  # the beta placement is not read
    ({"temperature": 0.8}, "session.temperature"),
    ({"type": "transcription"}, "session.type"),
    ({"model": "llama-70b"}, "session.model"),
    ({"output_modalities": ["audio", "text"]}, "session.output_modalities"),
    ({"tracing": {"workflow_name": "x"}}, "session.tracing"),
    ({"truncation": "disabled"}, "session.truncation"),
    ({"include": ["item.input_audio_transcription.logprobs"]}, "session.include"),
    ({"prompt": {"id": "pmpt_1"}}, "session.prompt"),
    ({"reasoning": {"effort": "low"}}, "session.reasoning"),
    ({"parallel_tool_calls": False}, "session.parallel_tool_calls"),
    ({"audio": {"video": {}}}, "session.audio.video"),
    ({"audio": {"output": {"voice": "alloy"}}}, "session.audio.output.voice"),
    ({"audio": {"output": {"speed": 1.5}}}, "session.audio.output.speed"),
    ({"audio": {"output": {"format": {"type": "audio/pcmu"}}}}, "session.audio.output.format"),
    (
        {"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}},
        "session.audio.input.format",
    ),
    (
        {"audio": {"input": {"noise_reduction": {"type": "near_field"}}}},
        "session.audio.input.noise_reduction",
    ),
    (
        {"audio": {"input": {"transcription": {"model": "nova-2"}}}},
        "session.audio.input.transcription.model",
    ),
    (
        {"audio": {"input": {"transcription": {"language": "fr"}}}},
        "session.audio.input.transcription.language",
    ),
    (
        {"audio": {"input": {"transcription": {"prompt": "names: Elinor"}}}},
        "session.audio.input.transcription.prompt",
    ),
    (
        {"audio": {"input": {"transcription": {"diarize": True}}}},
        "session.audio.input.transcription.diarize",
    ),
    (
        {"audio": {"input": {"turn_detection": {"type": "vad"}}}},
        "session.audio.input.turn_detection.type",
    ),
    (
        {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": "eager"}}}},
        "session.audio.input.turn_detection.eagerness",
    ),
    (  # not a string: refused as a value, not a TypeError looking it up
        {"audio": {"input": {"turn_detection": {"type": "semantic_vad", "eagerness": ["low"]}}}},
        "session.audio.input.turn_detection.eagerness",
    ),
    (
        {
            "audio": {
                "input": {"turn_detection": {"type": "semantic_vad", "silence_duration_ms": 500}}
            }
        },
        "session.audio.input.turn_detection.silence_duration_ms",
    ),
    (
        {"audio": {"input": {"turn_detection": {"idle_timeout_ms": 5000}}}},
        "session.audio.input.turn_detection.idle_timeout_ms",
    ),
    (
        {"audio": {"input": {"turn_detection": {"threshold": 2}}}},
        "session.audio.input.turn_detection.threshold",
    ),
    (
        {"audio": {"input": {"turn_detection": {"prefix_padding_ms": -1}}}},
        "session.audio.input.turn_detection.prefix_padding_ms",
    ),
    (
        {"audio": {"input": {"turn_detection": {"create_response": "yes"}}}},
        "session.audio.input.turn_detection.create_response",
    ),
]


@pytest.mark.parametrize(("session", "param"), REFUSED)
async def test_what_the_server_cannot_honour_is_refused_and_changes_nothing(
    wire: Wire, session: dict[str, Any], param: str
) -> None:
    protocol, sent = wire
    before = (protocol.session.turn_detection, protocol.session.audio_output)
    update(protocol, {"instructions": "Changed.", **session})
    (error,) = sent
    assert error["type"] == "error", error
    assert error["error"]["param"] == param
    assert error["error"]["message"]
    assert protocol.session.conversation.instructions != "Changed."
    assert (protocol.session.turn_detection, protocol.session.audio_output) == before


async def test_a_voice_it_does_not_have_is_refused_naming_the_one_it_has(wire: Wire) -> None:
    protocol, sent = wire
    update(protocol, {"audio": {"output": {"voice": "marin"}}})
    (error,) = sent
    assert error["error"]["code"] == "invalid_value"
    assert "'marin'" in error["error"]["message"] and "'joe'" in error["error"]["message"]


def _with_each_leaf_replaced(value: Any, wrong: Any) -> list[Any]:
    """Copies of ``value``, each with one of its leaves (or one whole
    object or list) replaced by ``wrong``."""
    copies: list[Any] = [wrong]
    if isinstance(value, dict):
        for key, inner in value.items():
            copies += [
                {**value, key: changed} for changed in _with_each_leaf_replaced(inner, wrong)
            ]
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            for changed in _with_each_leaf_replaced(inner, wrong):
                copies.append([*value[:index], changed, *value[index + 1 :]])
    return copies


@pytest.mark.parametrize("wrong", [["low"], {"a": 1}, 7, -1.5, True, "zzz", ""])
async def test_a_session_with_any_value_of_a_wrong_type_is_refused_not_crashed(
    wire: Wire, wrong: Any
) -> None:
    """The path a session bound to a client secret takes: whatever a value
    is, the session is applied or refused with a ClientEventError (which
    the caller hears as an error event), never another exception."""
    protocol, _ = wire
    full = {**AGENTS_SDK_SESSION, "max_output_tokens": 100}
    for session in _with_each_leaf_replaced(full, wrong):
        if not isinstance(session, dict):
            continue
        with contextlib.suppress(ClientEventError):
            protocol.apply_session_config(session)
