"""``session.update``: the Realtime session object a client sends, read into
the changes this server makes. Everything is checked before anything is
applied, so a refused update changes nothing.

Names that stand for OpenAI's own models (``gpt-realtime``, ``whisper-1``,
``gpt-4o-mini-transcribe``...) are accepted as meaning this server's LLM and
STT, so clients written for OpenAI work with their defaults; other names are
refused. ``semantic_vad`` is the end-of-turn model's (its eagerness sets the
model's threshold and the longest silence, ``EAGERNESS``); where the server
has no model, its eagerness picks how long a silence ends the turn
(``EAGERNESS_SILENCE_MS``), which is also the silence that decides when the
model cannot answer in time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from voice_agent.backends.base import ToolChoice, ToolSpec
from voice_agent.realtime import tool_items
from voice_agent.realtime.errors import ClientEventError
from voice_agent.realtime.params import (
    check_format,
    check_keys,
    check_voice,
    object_at,
    parse_bool,
    parse_int,
    parse_modalities,
    require_unset,
    unsupported,
)
from voice_agent.session.endpointing import EAGERNESS
from voice_agent.session.input import TurnDetection

JsonDict = dict[str, Any]
# semantic_vad's eagerness as the silence that ends a turn: "low" waits for
# a long pause (thinking aloud), "high" answers after a short one; "auto" is
# OpenAI's default and means "medium".
EAGERNESS_SILENCE_MS = {"low": 1200, "medium": 700, "auto": 700, "high": 400}
_OPENAI_REALTIME_MODEL = re.compile(r"gpt-[\w.-]*realtime[\w.-]*")
_OPENAI_STT_MODEL = re.compile(r"whisper-1|gpt-[\w.-]*(transcribe|whisper)[\w.-]*")

_SESSION_KEYS = (
    "type",
    "model",
    "instructions",
    "output_modalities",
    "audio",
    "tools",
    "tool_choice",
    "max_output_tokens",
    "tracing",
    "truncation",
    "prompt",
    "include",
    "parallel_tool_calls",
    "reasoning",
    "turn_detection",  # the beta API's placement, still sent by older clients
)
_SERVER_VAD_KEYS = (
    "type",
    "threshold",
    "prefix_padding_ms",
    "silence_duration_ms",
    "create_response",
    "interrupt_response",
    "idle_timeout_ms",
)
_SEMANTIC_VAD_KEYS = ("type", "eagerness", "create_response", "interrupt_response")
_TRANSCRIPTION_KEYS = ("model", "language", "prompt", "delay", "keywords", "languages")


@dataclass(frozen=True)
class ServerSession:
    """What the server offers a session: the names it answers to and its defaults."""

    model: str
    voices: tuple[str, ...]  # the TTS's, the default first
    stt_model: str
    server_tools: tuple[str, ...]
    token_cap: int
    default_turns: TurnDetection


@dataclass(frozen=True)
class TurnSetting:
    detection: TurnDetection | None  # None: push-to-talk
    eagerness: str | None = None  # semantic_vad's, as asked (told back)


@dataclass
class SessionChanges:
    """What a session.update changes; None: left as it is."""

    instructions: str | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    max_output_tokens: int | None = None
    turn: TurnSetting | None = None
    transcription: bool | None = None  # False: no transcription events
    audio_output: bool | None = None
    voice: str | None = None


def parse_session_update(session: JsonDict, server: ServerSession) -> SessionChanges:
    check_keys(session, _SESSION_KEYS, "session")
    changes = SessionChanges()
    if session.get("type", "realtime") != "realtime":
        raise unsupported("session.type", "only realtime sessions are supported")
    if "model" in session:
        _check_model(session["model"], server.model)
    instructions = session.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ClientEventError(
            "invalid_type", "instructions must be a string", "session.instructions"
        )
    changes.instructions = instructions
    if session.get("output_modalities") is not None:
        changes.audio_output = parse_modalities(
            session["output_modalities"], "session.output_modalities"
        )
    if "tools" in session:
        changes.tools = tool_items.parse_tools(session["tools"], server.server_tools)
    if "tool_choice" in session:
        changes.tool_choice = tool_items.parse_tool_choice(
            session["tool_choice"], "session.tool_choice"
        )
    if "max_output_tokens" in session:
        changes.max_output_tokens = tool_items.parse_max_tokens(
            session["max_output_tokens"], "session.max_output_tokens", server.token_cap
        )
    require_unset(
        session.get("tracing"), "session.tracing", "this server keeps no traces", ("auto",)
    )
    require_unset(
        session.get("truncation"),
        "session.truncation",
        "only 'auto' (the history is trimmed to --llm-history-turns)",
        ("auto",),
    )
    require_unset(session.get("prompt"), "session.prompt", "stored prompts are not supported")
    require_unset(session.get("include"), "session.include", "nothing extra can be included", ([],))
    require_unset(
        session.get("parallel_tool_calls"),
        "session.parallel_tool_calls",
        "the model may always call several tools at once",
        (True,),
    )
    require_unset(session.get("reasoning"), "session.reasoning", "set with --llm-reasoning-effort")
    if "turn_detection" in session:
        changes.turn = parse_turn_detection(
            session["turn_detection"], "session.turn_detection", server.default_turns
        )
    if session.get("audio") is not None:
        _parse_audio(object_at(session["audio"], "session.audio"), server, changes)
    return changes


def _check_model(value: Any, model: str) -> None:
    if not isinstance(value, str):
        raise ClientEventError("invalid_type", "model must be a string", "session.model")
    if value != model and not _OPENAI_REALTIME_MODEL.fullmatch(value):
        raise ClientEventError(
            "invalid_value",
            f"Invalid value: {value!r}. This server's model is {model!r}.",
            "session.model",
        )


def _parse_audio(audio: JsonDict, server: ServerSession, changes: SessionChanges) -> None:
    check_keys(audio, ("input", "output"), "session.audio")
    if audio.get("input") is not None:
        where = "session.audio.input"
        given = object_at(audio["input"], where)
        check_keys(given, ("format", "noise_reduction", "transcription", "turn_detection"), where)
        check_format(given.get("format"), f"{where}.format")
        require_unset(
            given.get("noise_reduction"), f"{where}.noise_reduction", "no noise reduction here"
        )
        if "transcription" in given:
            changes.transcription = _parse_transcription(given["transcription"], server)
        if "turn_detection" in given:
            changes.turn = parse_turn_detection(
                given["turn_detection"], f"{where}.turn_detection", server.default_turns
            )
    if audio.get("output") is not None:
        where = "session.audio.output"
        output = object_at(audio["output"], where)
        check_keys(output, ("format", "voice", "speed"), where)
        check_format(output.get("format"), f"{where}.format")
        if output.get("voice") is not None:
            changes.voice = check_voice(output["voice"], f"{where}.voice", server.voices)
        speed = output.get("speed")
        if speed is not None and (isinstance(speed, bool) or speed != 1.0):
            raise unsupported(f"{where}.speed", "only 1.0 (the speed set with --tts-speed)")


def _parse_transcription(value: Any, server: ServerSession) -> bool:
    """False for null (no transcription events); the settings must be ones
    this server's STT honours: it takes no language or prompt hints."""
    if value is None:
        return False
    where = "session.audio.input.transcription"
    given = object_at(value, where)
    check_keys(given, _TRANSCRIPTION_KEYS, where)
    model = given.get("model")
    openai_name = isinstance(model, str) and _OPENAI_STT_MODEL.fullmatch(model)
    if model is not None and model != server.stt_model and not openai_name:
        raise ClientEventError(
            "invalid_value",
            f"Invalid value: {model!r}. This server transcribes with {server.stt_model!r}.",
            f"{where}.model",
        )
    hint = "this server's STT takes no language or prompt hints"
    for key in ("language", "prompt", "delay", "keywords", "languages"):
        require_unset(given.get(key), f"{where}.{key}", hint, ("", []))
    return True


def parse_turn_detection(value: Any, where: str, defaults: TurnDetection) -> TurnSetting:
    """A turn_detection object replaces the one before, as in OpenAI's API:
    what it leaves out takes the server's defaults. null: push-to-talk."""
    if value is None:
        return TurnSetting(None)
    given = object_at(value, where)
    kind = given.get("type", "server_vad")
    create, interrupt = (
        True if given.get(key) is None else parse_bool(given[key], f"{where}.{key}")
        for key in ("create_response", "interrupt_response")
    )
    defaults = replace(defaults, create_response=create, interrupt_response=interrupt)
    if kind == "semantic_vad":
        check_keys(given, _SEMANTIC_VAD_KEYS, where)
        eagerness = given.get("eagerness") or "auto"
        # Checked as a string first: a list or an object is not a key to look up.
        if not isinstance(eagerness, str) or eagerness not in EAGERNESS_SILENCE_MS:
            raise ClientEventError(
                "invalid_value",
                "eagerness must be one of low, medium, high, auto",
                f"{where}.eagerness",
            )
        silence = EAGERNESS_SILENCE_MS[eagerness]
        semantic = EAGERNESS[eagerness]
        return TurnSetting(replace(defaults, silence_ms=silence, semantic=semantic), eagerness)
    if kind != "server_vad":
        raise ClientEventError(
            "invalid_value",
            "turn_detection type must be server_vad or semantic_vad",
            f"{where}.type",
        )
    check_keys(given, _SERVER_VAD_KEYS, where)
    require_unset(given.get("idle_timeout_ms"), f"{where}.idle_timeout_ms", "no idle timeout here")
    detection = replace(defaults, semantic=None)
    if given.get("silence_duration_ms") is not None:
        silence = parse_int(given["silence_duration_ms"], f"{where}.silence_duration_ms", 100, 5000)
        detection = replace(detection, silence_ms=silence)
    if given.get("prefix_padding_ms") is not None:
        preroll = parse_int(given["prefix_padding_ms"], f"{where}.prefix_padding_ms", 0, 2000)
        detection = replace(detection, preroll_ms=preroll)
    if given.get("threshold") is not None:
        threshold = given["threshold"]
        if isinstance(threshold, bool) or not isinstance(threshold, int | float):
            raise ClientEventError(
                "invalid_type", "threshold must be a number", f"{where}.threshold"
            )
        if not 0.0 < threshold <= 1.0:
            raise ClientEventError(
                "invalid_value", "threshold must be above 0.0, at most 1.0", f"{where}.threshold"
            )
        detection = replace(detection, threshold=float(threshold))
    return TurnSetting(detection)
