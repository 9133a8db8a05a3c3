"""The session as the client sees it: applying a Realtime session object
(``session.update``, or the one a call is created with) to the
VoiceSession, and the ``session`` object that session.created and
session.updated tell back.

Kept apart because it holds what the client asked for in Realtime terms
and the VoiceSession does not keep (the tools as JSON, whether transcripts
are wanted, semantic_vad's eagerness): client events change it, server
events only read it.
"""

from __future__ import annotations

import time
from typing import Any

from voice_agent.realtime import tool_items
from voice_agent.realtime.session_config import (
    ServerSession,
    TurnSetting,
    parse_session_update,
)
from voice_agent.session.endpointing import SERVER_EAGERNESS
from voice_agent.session.input import TurnDetection
from voice_agent.session.session import VoiceSession

JsonDict = dict[str, Any]


def modalities(audio: bool) -> list[str]:
    return ["audio"] if audio else ["text"]


class SessionSettings:
    def __init__(
        self, session: VoiceSession, model: str, voice: str, max_output_tokens: int
    ) -> None:
        self.session = session
        self.model = model
        self.voice = voice  # the session's, told in its session object
        self.max_output_tokens = max_output_tokens
        self._session_object_id = session.id
        self._expires_at = int(time.time()) + 3600
        self.transcription = True  # False: the client asked for no transcripts
        self._eagerness: str | None = None  # semantic_vad's, when that was asked for
        self._tools_json: list[JsonDict] = []

    def _turn_detection_json(self) -> JsonDict | None:
        detection = self.session.turn_detection
        if detection is None:
            return None
        flags = {
            "create_response": detection.create_response,
            "interrupt_response": detection.interrupt_response,
        }
        if self._eagerness is not None or detection.semantic is not None:
            eagerness = self._eagerness or SERVER_EAGERNESS
            return {"type": "semantic_vad", "eagerness": eagerness, **flags}
        return {
            "type": "server_vad",
            "threshold": detection.threshold,
            "prefix_padding_ms": detection.preroll_ms,
            "silence_duration_ms": detection.silence_ms,
            "idle_timeout_ms": None,
            **flags,
        }

    def session_object(self) -> JsonDict:
        transcription = (
            {"model": self.session.models.stt.name, "language": None, "prompt": None}
            if self.transcription
            else None
        )
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self._session_object_id,
            "model": self.model,
            "output_modalities": modalities(self.session.audio_output),
            "instructions": self.session.conversation.instructions,
            "tools": self._tools_json,
            "tool_choice": self.session.tool_choice,
            "max_output_tokens": self.session.config.reply.max_tokens,
            "tracing": None,
            "truncation": "auto",
            "prompt": None,
            "expires_at": self._expires_at,
            "include": None,
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "transcription": transcription,
                    "noise_reduction": None,
                    "turn_detection": self._turn_detection_json(),
                },
                "output": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "voice": self.voice,
                    "speed": 1.0,
                },
            },
        }

    def _server_session(self) -> ServerSession:
        turn = self.session.config.turn
        server_tools = self.session.config.tools
        return ServerSession(
            model=self.model,
            voices=tuple(self.session.models.tts.voices()),
            stt_model=self.session.models.stt.name,
            server_tools=tuple(t.name for t in server_tools.specs) if server_tools else (),
            token_cap=self.max_output_tokens,
            default_turns=TurnDetection(turn.turn_silence_ms, turn.threshold, turn.preroll_ms),
        )

    def apply(self, session: JsonDict) -> None:
        """Apply a Realtime session object; anything this server cannot do
        is refused (ClientEventError) before any of it is applied."""
        changes = parse_session_update(session, self._server_session())
        self.session.update(
            instructions=changes.instructions,
            tools=changes.tools,
            tool_choice=changes.tool_choice,
            max_output_tokens=changes.max_output_tokens,
            audio_output=changes.audio_output,
            voice=changes.voice,
        )
        if changes.voice is not None:
            self.voice = changes.voice
        if changes.tools is not None:
            self._tools_json = tool_items.tools_json(changes.tools)
        if changes.transcription is not None:
            self.transcription = changes.transcription
        if changes.turn is not None:
            self._set_turns(changes.turn)

    def _set_turns(self, turn: TurnSetting) -> None:
        self._eagerness = turn.eagerness
        self.session.set_turn_detection(turn.detection)
