"""Translate between session events and OpenAI Realtime (GA) JSON events.

Server events follow the shapes of OpenAI's own SDK types, because its client
libraries validate them: every event has an ``event_id``; user and assistant
turns are conversation items the other events refer to by ``item_id``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from voice_agent import strict_json
from voice_agent.ratelimit import TokenBucket
from voice_agent.realtime import tool_items
from voice_agent.realtime.errors import ClientEventError as ClientEventError  # re-exported
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
from voice_agent.session.ids import new_id
from voice_agent.session.session import VoiceSession

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
# The schema knows two reasons for a cancelled response; ours map onto them.
_CANCEL_REASONS = {
    "turn_detected": "turn_detected",
    "superseded": "turn_detected",  # a newer user turn replaced it
    "client_cancelled": "client_cancelled",
    "session_closed": "client_cancelled",
}
MAX_CLIENT_EVENT_BYTES = 256 * 1024
# Client events one session may send: a flood is throttled in that session
# alone (its handlers run on the loop every session shares).
EVENTS_PER_SECOND = 100
EVENT_BURST = 200


class RealtimeProtocol:
    def __init__(
        self,
        session: VoiceSession,
        send: Callable[[JsonDict], None],
        model: str,
        voice: str,
        max_output_tokens: int,
    ) -> None:
        self.session = session
        self._send_raw = send
        self.model = model
        self.voice = voice
        self.max_output_tokens = max_output_tokens
        self._session_object_id = session.id
        self._expires_at = int(time.time()) + 3600
        self._transcripts: dict[str, str] = {}  # response_id -> text so far
        # Items in the order the client was told about them.
        self._last_item_id: str | None = None
        self._previous: dict[str, str | None] = {}  # item_id -> the item before it
        # response_id -> its function calls, told with (just before) response.done.
        self._calls: dict[str, list[FunctionCallRequested]] = {}
        # Responses whose message item (output 0) the client has been told about:
        # announced with the first words, so a call-only reply has none.
        self._announced: set[str] = set()
        self._tools_json: list[JsonDict] = []
        self._event_budget = TokenBucket(EVENTS_PER_SECOND, EVENT_BURST)
        self.events_dropped = 0
        self._dropped_told = 0.0  # when the client was last told of dropped events

    def _place_item(self, item_id: str) -> str | None:
        """Append an item to the client's view of the conversation."""
        previous, self._last_item_id = self._last_item_id, item_id
        self._previous[item_id] = previous
        return previous

    # -- outbound ------------------------------------------------------------
    def send(self, event: JsonDict) -> None:
        self._send_raw({"event_id": new_id("event"), **event})

    def session_object(self) -> JsonDict:
        turn = self.session.config.turn
        silence_ms = self.session.current_silence_ms
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self._session_object_id,
            "model": self.model,
            "output_modalities": ["audio"],
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
                    "transcription": {"model": self.session.models.stt.name},
                    "noise_reduction": None,
                    "turn_detection": {
                        "type": "server_vad",
                        "threshold": turn.threshold,
                        "prefix_padding_ms": turn.preroll_ms,
                        "silence_duration_ms": silence_ms,
                        "idle_timeout_ms": None,
                        "create_response": True,
                        "interrupt_response": True,
                    },
                },
                "output": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "voice": self.voice,
                    "speed": 1.0,
                },
            },
        }

    def send_session_created(self) -> None:
        self.send({"type": "session.created", "session": self.session_object()})

    def on_session_event(self, event: SessionEvent) -> None:
        for message in self._translate(event):
            self.send(message)

    def _assistant_item(self, item_id: str, status: str, transcript: str | None) -> JsonDict:
        content = [] if transcript is None else [{"type": "output_audio", "transcript": transcript}]
        return {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def _user_item(self, item_id: str, transcript: str | None) -> JsonDict:
        return {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_audio", "transcript": transcript}],
        }

    def _response_object(self, response_id: str, status: str, **extra: Any) -> JsonDict:
        return {
            "object": "realtime.response",
            "id": response_id,
            "status": status,
            "status_details": None,
            "output": [],
            "conversation_id": None,
            "output_modalities": ["audio"],
            "max_output_tokens": self.session.config.reply.max_tokens,
            "audio": {
                "output": {"format": {"type": "audio/pcm", "rate": 24000}, "voice": self.voice}
            },
            "usage": None,
            "metadata": None,
            **extra,
        }

    def _translate(self, event: SessionEvent) -> list[JsonDict]:
        if isinstance(event, UserSpeechStarted):
            return [
                {
                    "type": "input_audio_buffer.speech_started",
                    "audio_start_ms": event.audio_start_ms,
                    "item_id": event.item_id,
                }
            ]
        if isinstance(event, UserSpeechStopped):
            return [
                {
                    "type": "input_audio_buffer.speech_stopped",
                    "audio_end_ms": event.audio_end_ms,
                    "item_id": event.item_id,
                }
            ]
        if isinstance(event, UserTurnCommitted):
            previous = self._place_item(event.item_id)
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
        if isinstance(event, UserTranscriptDelta):
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
        if isinstance(event, UserTranscript):
            return [
                {
                    "type": "conversation.item.input_audio_transcription.completed",
                    "item_id": event.item_id,
                    "content_index": 0,
                    "transcript": event.transcript,
                    "usage": {"type": "duration", "seconds": 0},
                },
                {
                    "type": "conversation.item.done",
                    "previous_item_id": self._previous.pop(event.item_id, None),
                    "item": self._user_item(event.item_id, event.transcript),
                },
            ]
        if isinstance(event, UserTranscriptFailed):
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
                    "previous_item_id": self._previous.pop(event.item_id, None),
                    "item": self._user_item(event.item_id, None),
                },
            ]
        if isinstance(event, ResponseStarted):
            self._transcripts[event.response_id] = ""
            return [
                {
                    "type": "response.created",
                    "response": self._response_object(event.response_id, "in_progress"),
                }
            ]
        if isinstance(event, AssistantTextDelta):
            self._transcripts[event.response_id] = (
                self._transcripts.get(event.response_id, "") + event.delta
            )
            return [
                *self._announce_message(event.response_id, event.item_id),
                {
                    "type": "response.output_audio_transcript.delta",
                    "response_id": event.response_id,
                    "item_id": event.item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": event.delta,
                },
            ]
        if isinstance(event, AssistantAudioStarted):
            return [{"type": "output_audio_buffer.started", "response_id": event.response_id}]
        if isinstance(event, AssistantAudioStopped):
            return [{"type": "output_audio_buffer.stopped", "response_id": event.response_id}]
        if isinstance(event, AssistantAudioCleared):
            return [{"type": "output_audio_buffer.cleared", "response_id": event.response_id}]
        if isinstance(event, ResponseFinished):
            return self._response_finished(event)
        if isinstance(event, FunctionCallRequested):
            return self._function_call(event)
        if isinstance(event, SessionError):
            return [self._error("server_error", event.code, event.message)]
        raise AssertionError(f"unhandled session event {event!r}")

    def _announce_message(self, response_id: str, item_id: str) -> list[JsonDict]:
        """The reply's message item, output 0, the first time it is needed."""
        if response_id in self._announced:
            return []
        self._announced.add(response_id)
        previous = self._place_item(item_id)
        ref = {
            "response_id": response_id,
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
        }
        return [
            {
                "type": "response.output_item.added",
                "response_id": response_id,
                "output_index": 0,
                "item": self._assistant_item(item_id, "in_progress", None),
            },
            {
                "type": "conversation.item.added",
                "previous_item_id": previous,
                "item": self._assistant_item(item_id, "in_progress", None),
            },
            {
                "type": "response.content_part.added",
                **ref,
                "part": {"type": "audio", "transcript": ""},
            },
        ]

    def _function_call(self, event: FunctionCallRequested) -> list[JsonDict]:
        # Told after the message item is done (GA order); the session hands
        # calls over right before the reply finishes.
        self._calls.setdefault(event.response_id, []).append(event)
        return []

    def _call_events(self, calls: list[FunctionCallRequested], first: int) -> list[JsonDict]:
        events: list[JsonDict] = []
        for index, call in enumerate(calls, start=first):
            previous = self._place_item(call.item_id)
            self._previous.pop(call.item_id, None)
            events += tool_items.function_call_events(call, index, previous)
        return events

    def _response_finished(self, event: ResponseFinished) -> list[JsonDict]:
        self._transcripts.pop(event.response_id, None)
        calls = self._calls.pop(event.response_id, [])
        call_items = [tool_items.function_call_item(c, "completed") for c in calls]
        # A reply that only called functions has no message item.
        if calls and event.response_id not in self._announced:
            response = self._response_object(event.response_id, event.status, output=call_items)
            response["status_details"] = self._status_details(event)
            response["metadata"] = self._metadata(event)
            return [
                *self._call_events(calls, 0),
                {"type": "response.done", "response": response},
            ]
        announce = self._announce_message(event.response_id, event.item_id)
        self._announced.discard(event.response_id)
        ref = {
            "response_id": event.response_id,
            "item_id": event.item_id,
            "output_index": 0,
            "content_index": 0,
        }
        item_status = "completed" if event.status == "completed" else "incomplete"
        item = self._assistant_item(event.item_id, item_status, event.transcript)
        response = self._response_object(
            event.response_id,
            event.status,
            output=[item, *call_items],
            metadata=self._metadata(event),
        )
        response["status_details"] = self._status_details(event)
        return [
            *announce,
            {"type": "response.output_audio.done", **ref},
            {
                "type": "response.output_audio_transcript.done",
                **ref,
                "transcript": event.transcript,
            },
            {
                "type": "response.content_part.done",
                **ref,
                "part": {"type": "audio", "transcript": event.transcript},
            },
            {
                "type": "response.output_item.done",
                "response_id": event.response_id,
                "output_index": 0,
                "item": item,
            },
            {
                "type": "conversation.item.done",
                "previous_item_id": self._previous.pop(event.item_id, None),
                "item": item,
            },
            *self._call_events(calls, 1),
            {"type": "response.done", "response": response},
        ]

    def _status_details(self, event: ResponseFinished) -> JsonDict | None:
        if event.status == "cancelled":
            reason = _CANCEL_REASONS.get(event.reason or "", "turn_detected")
            return {"type": "cancelled", "reason": reason}
        if event.status == "failed":
            return {"type": "failed", "error": {"type": "server_error", "code": event.reason}}
        return None

    def _metadata(self, event: ResponseFinished) -> dict[str, str] | None:
        if event.metrics is None:
            return None
        # Metadata values are strings in the Realtime schema.
        metadata = {k: str(v) for k, v in event.metrics.spans().items() if v is not None}
        metadata["speculative"] = str(event.metrics.speculative).lower()
        return metadata

    def _error(
        self,
        error_type: str,
        code: str,
        message: str,
        param: str | None = None,
        event_id: str | None = None,
    ) -> JsonDict:
        return {
            "type": "error",
            "error": {
                "type": error_type,
                "code": code,
                "message": message,
                "param": param,
                "event_id": event_id,
            },
        }

    def undeliverable(self, kind: str | None, size: int) -> JsonDict:
        """The error sent in place of an event too large for the peer."""
        return {
            "event_id": new_id("event"),
            **self._error(
                "invalid_request_error",
                "event_too_large",
                f"a {kind or 'server'} event of {size} bytes is larger than this peer "
                "accepts (its max-message-size); it was not sent",
            ),
        }

    # -- inbound ------------------------------------------------------------
    def _drop_flooded(self) -> None:
        """Drop an event over the session's rate; say so at most once a
        second (an error per dropped event would feed the flood)."""
        self.events_dropped += 1
        now = time.monotonic()
        if now - self._dropped_told >= 1.0:
            self._dropped_told = now
            self.send(
                self._error(
                    "invalid_request_error",
                    "rate_limited",
                    f"more than {EVENTS_PER_SECOND} events a second: "
                    f"{self.events_dropped} dropped so far",
                    None,
                    None,
                )
            )

    def on_client_message(self, raw: str | bytes) -> None:
        """Handle one data-channel message; bad input becomes an ``error`` event."""
        if self._event_budget.take() is not None:
            self._drop_flooded()
            return
        client_event_id: str | None = None
        try:
            if len(raw) > MAX_CLIENT_EVENT_BYTES:
                raise ClientEventError("event_too_large", "event exceeds 256 KiB")
            try:
                event = strict_json.loads(raw)
            except strict_json.JsonRefused as exc:
                raise ClientEventError("invalid_json", f"event is not valid JSON: {exc}") from None
            if not isinstance(event, dict):
                raise ClientEventError("invalid_event", "event must be a JSON object")
            raw_id = event.get("event_id")
            client_event_id = raw_id if isinstance(raw_id, str) else None
            event_type = event.get("type")
            if not isinstance(event_type, str):
                raise ClientEventError("invalid_event", "event has no 'type'", "type")
            handler = self._handlers().get(event_type)
            if handler is None:
                raise ClientEventError(
                    "unknown_event", f"unsupported event type {event_type!r}", "type"
                )
            handler(event)
        except ClientEventError as exc:
            self.send(
                self._error("invalid_request_error", exc.code, str(exc), exc.param, client_event_id)
            )
        except RecursionError:
            self.send(
                self._error(
                    "invalid_request_error",
                    "invalid_json",
                    "event is nested too deeply",
                    None,
                    client_event_id,
                )
            )
        except Exception as exc:  # a bug of ours must not take the caller's call down
            log.exception("client event failed")
            self.send(
                self._error(
                    "server_error",
                    "internal_error",
                    f"the event could not be handled: {type(exc).__name__}",
                    None,
                    client_event_id,
                )
            )

    def _handlers(self) -> dict[str, Callable[[JsonDict], None]]:
        return {
            "session.update": self._session_update,
            "response.cancel": self._response_cancel,
            "output_audio_buffer.clear": self._output_clear,
            "conversation.item.create": self._item_create,
            "response.create": self._response_create,
        }

    def _session_update(self, event: JsonDict) -> None:
        session = event.get("session")
        if not isinstance(session, dict):
            raise ClientEventError("invalid_value", "'session' must be an object", "session")
        self.apply_session_config(session)
        self.send({"type": "session.updated", "session": self.session_object()})

    def apply_session_config(self, session: JsonDict) -> None:
        """Apply the parts of a Realtime session object this server supports."""
        instructions = session.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise ClientEventError(
                "invalid_type", "instructions must be a string", "session.instructions"
            )
        silence_ms: int | None = None
        audio = session.get("audio")
        turn = None
        if isinstance(audio, dict) and isinstance(audio.get("input"), dict):
            turn = audio["input"].get("turn_detection")
        if turn is None:
            turn = session.get("turn_detection")  # beta-style placement
        if isinstance(turn, dict) and "silence_duration_ms" in turn:
            value = turn["silence_duration_ms"]
            if not isinstance(value, int) or isinstance(value, bool) or not 100 <= value <= 5000:
                raise ClientEventError(
                    "invalid_value",
                    "silence_duration_ms must be an integer from 100 to 5000",
                    "session.audio.input.turn_detection.silence_duration_ms",
                )
            silence_ms = value
        server_tools = self.session.config.tools
        tools = (
            tool_items.parse_tools(
                session["tools"], [t.name for t in server_tools.specs] if server_tools else ()
            )
            if "tools" in session
            else None
        )
        tool_choice = (
            tool_items.parse_tool_choice(session["tool_choice"], "session.tool_choice")
            if "tool_choice" in session
            else None
        )
        max_tokens = (
            tool_items.parse_max_tokens(
                session["max_output_tokens"], "session.max_output_tokens", self.max_output_tokens
            )
            if "max_output_tokens" in session
            else None
        )
        self.session.update(
            instructions=instructions,
            silence_ms=silence_ms,
            tools=tools,
            tool_choice=tool_choice,
            max_output_tokens=max_tokens,
        )
        if tools is not None:
            self._tools_json = tool_items.tools_json(tools)

    def _item_create(self, event: JsonDict) -> None:
        """A typed user message or a function call's result joins the conversation."""
        item = tool_items.parse_item(event.get("item"), new_id("item"))
        if isinstance(item, tool_items.FunctionOutput):
            if not self.session.add_function_output(item.call_id, item.output):
                raise ClientEventError(
                    "invalid_value",
                    f"no function call {item.call_id!r} is waiting for its output",
                    "item.call_id",
                )
        else:
            self.session.add_user_text(item.text)
        previous = self._place_item(item.item_id)
        self._previous.pop(item.item_id, None)
        for kind in ("conversation.item.added", "conversation.item.done"):
            self.send({"type": kind, "previous_item_id": previous, "item": item.json()})

    def _response_create(self, event: JsonDict) -> None:
        options = event.get("response") or {}
        if not isinstance(options, dict):
            raise ClientEventError("invalid_value", "'response' must be an object", "response")
        instructions = options.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise ClientEventError(
                "invalid_type", "instructions must be a string", "response.instructions"
            )
        max_tokens = (
            tool_items.parse_max_tokens(
                options["max_output_tokens"], "response.max_output_tokens", self.max_output_tokens
            )
            if "max_output_tokens" in options
            else None
        )
        if not self.session.create_response(instructions, max_tokens):
            raise ClientEventError(
                "conversation_already_has_active_response",
                "Conversation already has an active response in progress",
            )

    def _response_cancel(self, event: JsonDict) -> None:
        if not self.session.cancel_response("client_cancelled"):
            raise ClientEventError(
                "response_cancel_not_active", "Cancellation failed: no active response found"
            )

    def _output_clear(self, event: JsonDict) -> None:
        self.session.clear_output()
