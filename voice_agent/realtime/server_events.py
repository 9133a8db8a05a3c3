"""Translate session events into Realtime (GA) server events.

Server events follow the shapes of OpenAI's own SDK types, because its client
libraries validate them: every event has an ``event_id`` (added when sent);
user and assistant turns are conversation items the other events refer to
by ``item_id``.

Each session event type has one handler, found in a table: the user's side
of the conversation (speech, the committed turn, its transcript) and the
output audio buffer are told here; responses, which carry state of their
own, are told by response_events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from voice_agent.realtime.errors import error_event
from voice_agent.realtime.items import ItemPlacement
from voice_agent.realtime.response_events import ResponseEvents
from voice_agent.realtime.session_object import SessionSettings
from voice_agent.session.events import (
    AssistantAudioCleared,
    AssistantAudioStarted,
    AssistantAudioStopped,
    AssistantTextDelta,
    FunctionCallRequested,
    ResponseFinished,
    ResponseStarted,
    SessionError,
    SessionEvent,
    UserSpeechStarted,
    UserSpeechStopped,
    UserTranscript,
    UserTranscriptDelta,
    UserTranscriptFailed,
    UserTurnCommitted,
)
from voice_agent.session.session import VoiceSession

JsonDict = dict[str, Any]
# Each handler takes the one event type it is filed under.
Handler = Callable[[Any], list[JsonDict]]


class ServerEvents:
    def __init__(
        self, session: VoiceSession, settings: SessionSettings, placement: ItemPlacement
    ) -> None:
        self._settings = settings
        self._placement = placement
        self.responses = ResponseEvents(session, settings, placement)
        # Looked up by exact type: no session event type is subclassed.
        self._handlers: dict[type[SessionEvent], Handler] = {
            UserSpeechStarted: self._speech_started,
            UserSpeechStopped: self._speech_stopped,
            UserTurnCommitted: self._turn_committed,
            UserTranscriptDelta: self._transcript_delta,
            UserTranscript: self._user_transcript,
            UserTranscriptFailed: self._transcript_failed,
            ResponseStarted: self.responses.started,
            AssistantTextDelta: self.responses.text_delta,
            AssistantAudioStarted: self._audio_started,
            AssistantAudioStopped: self._audio_stopped,
            AssistantAudioCleared: self._audio_cleared,
            ResponseFinished: self.responses.finished,
            FunctionCallRequested: self.responses.function_call,
            SessionError: self._session_error,
        }

    def translate(self, event: SessionEvent) -> list[JsonDict]:
        handler = self._handlers.get(type(event))
        if handler is None:
            raise AssertionError(f"unhandled session event {event!r}")
        return handler(event)

    def _user_item(self, item_id: str, transcript: str | None) -> JsonDict:
        return {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": transcript}],
        }

    def _speech_started(self, event: UserSpeechStarted) -> list[JsonDict]:
        return [
            {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": event.audio_start_ms,
                "item_id": event.item_id,
            }
        ]

    def _speech_stopped(self, event: UserSpeechStopped) -> list[JsonDict]:
        return [
            {
                "type": "input_audio_buffer.speech_stopped",
                "audio_end_ms": event.audio_end_ms,
                "item_id": event.item_id,
            }
        ]

    def _turn_committed(self, event: UserTurnCommitted) -> list[JsonDict]:
        previous = self._placement.place(self._user_item(event.item_id, None), busy=True)
        return [
            {
                "type": "input_audio_buffer.committed",
                "item_id": event.item_id,
                "previous_item_id": previous,
            },
            {
                "type": "conversation.item.added",
                "previous_item_id": previous,
                "item": self._user_item(event.item_id, None),
            },
        ]

    def _transcript_delta(self, event: UserTranscriptDelta) -> list[JsonDict]:
        if not self._settings.transcription:
            return []
        # Sent while the user speaks, so before the item is committed;
        # the item_id is the one speech_started announced.
        return [
            {
                "type": "conversation.item.input_audio_transcription.delta",
                "item_id": event.item_id,
                "content_index": 0,
                "delta": event.delta,
            }
        ]

    def _user_transcript(self, event: UserTranscript) -> list[JsonDict]:
        transcription = self._settings.transcription
        item = self._user_item(event.item_id, event.transcript if transcription else None)
        self._placement.log.update(item)
        completed = {
            "type": "conversation.item.input_audio_transcription.completed",
            "item_id": event.item_id,
            "content_index": 0,
            "transcript": event.transcript,
            "usage": {"type": "duration", "seconds": 0},
        }
        return [
            *([completed] if transcription else []),
            {
                "type": "conversation.item.done",
                "previous_item_id": self._placement.done(event.item_id),
                "item": item,
            },
        ]

    def _transcript_failed(self, event: UserTranscriptFailed) -> list[JsonDict]:
        item = self._user_item(event.item_id, None)
        self._placement.log.update(item)
        return [
            {
                "type": "conversation.item.input_audio_transcription.failed",
                "item_id": event.item_id,
                "content_index": 0,
                "error": {
                    "type": "transcription_error",
                    "code": event.code,
                    "message": event.message,
                    "param": None,
                },
            },
            {
                "type": "conversation.item.done",
                "previous_item_id": self._placement.done(event.item_id),
                "item": item,
            },
        ]

    def _audio_started(self, event: AssistantAudioStarted) -> list[JsonDict]:
        return [{"type": "output_audio_buffer.started", "response_id": event.response_id}]

    def _audio_stopped(self, event: AssistantAudioStopped) -> list[JsonDict]:
        return [{"type": "output_audio_buffer.stopped", "response_id": event.response_id}]

    def _audio_cleared(self, event: AssistantAudioCleared) -> list[JsonDict]:
        return [{"type": "output_audio_buffer.cleared", "response_id": event.response_id}]

    def _session_error(self, event: SessionError) -> list[JsonDict]:
        return [error_event("server_error", event.code, event.message)]
