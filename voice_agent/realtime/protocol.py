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
from voice_agent.realtime.errors import error_event
from voice_agent.realtime.input_audio import InputAudioEvents
from voice_agent.realtime.items import ItemEvents, ItemLog
from voice_agent.realtime.response_options import parse_response_options
from voice_agent.realtime.session_config import (
    ServerSession,
    TurnSetting,
    parse_session_update,
)
from voice_agent.session.endpointing import SERVER_EAGERNESS
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
from voice_agent.session.input import TurnDetection
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
# Events queued for a client that does not read them (a data channel whose
# peer stops acknowledging, a WebSocket nobody reads): beyond this the call
# ends as "slow_client". Normal traffic keeps a few KiB queued; without a
# bound, a client asking again and again for a large item and never
# reading grows the worker until it is killed.
MAX_UNSENT_EVENT_BYTES = 4 * 1024 * 1024
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
        self.voice = voice  # the session's, told in its session object
        self.max_output_tokens = max_output_tokens
        self._session_object_id = session.id
        self._expires_at = int(time.time()) + 3600
        self._transcripts: dict[str, str] = {}  # response_id -> text so far
        # Items in the order the client was told about them, as the server holds them.
        self.items = ItemLog()
        self._previous: dict[str, str | None] = {}  # item_id -> the item before it
        # How each response in progress was asked for (text only, out of band, metadata).
        self._responses: dict[str, ResponseStarted] = {}
        self._transcription = True  # False: the client asked for no transcripts
        self._eagerness: str | None = None  # semantic_vad's, when that was asked for
        self._item_events = ItemEvents(session, self.items, self.send)
        self._input_audio = InputAudioEvents(session, self.send)
        # response_id -> its function calls, told with (just before) response.done.
        self._calls: dict[str, list[FunctionCallRequested]] = {}
        # Responses whose message item (output 0) the client has been told about:
        # announced with the first words, so a call-only reply has none.
        self._announced: set[str] = set()
        self._tools_json: list[JsonDict] = []
        self._event_budget = TokenBucket(EVENTS_PER_SECOND, EVENT_BURST)
        self.events_dropped = 0
        self._dropped_told = 0.0  # when the client was last told of dropped events

    def _place_item(self, item: JsonDict, busy: bool = False) -> str | None:
        """Append an item to the client's view of the conversation."""
        previous = self.items.place(item, busy)
        self._previous[item["id"]] = previous
        return previous

    # -- outbound ------------------------------------------------------------
    def send(self, event: JsonDict) -> None:
        self._send_raw({"event_id": new_id("event"), **event})

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

    def _modalities(self, audio: bool) -> list[str]:
        return ["audio"] if audio else ["text"]

    def session_object(self) -> JsonDict:
        transcription = (
            {"model": self.session.models.stt.name, "language": None, "prompt": None}
            if self._transcription
            else None
        )
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self._session_object_id,
            "model": self.model,
            "output_modalities": self._modalities(self.session.audio_output),
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

    def send_session_created(self) -> None:
        self.send({"type": "session.created", "session": self.session_object()})

    def on_session_event(self, event: SessionEvent) -> None:
        for message in self._translate(event):
            self.send(message)

    def _assistant_item(
        self, item_id: str, status: str, transcript: str | None, audio: bool = True
    ) -> JsonDict:
        part = (
            {"type": "output_audio", "transcript": transcript}
            if audio
            else {"type": "output_text", "text": transcript}
        )
        content = [] if transcript is None else [part]
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
        started = self._responses.get(response_id)
        audio = started is None or started.audio
        return {
            "object": "realtime.response",
            "id": response_id,
            "status": status,
            "status_details": None,
            "output": [],
            "conversation_id": None,
            "output_modalities": self._modalities(audio),
            "max_output_tokens": self.session.config.reply.max_tokens,
            "audio": {
                "output": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "voice": started.voice if started and started.voice else self.voice,
                }
            },
            "usage": None,
            "metadata": dict(started.metadata) if started and started.metadata else None,
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
            previous = self._place_item(self._user_item(event.item_id, None), busy=True)
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
            if not self._transcription:
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
        if isinstance(event, UserTranscript):
            return self._user_transcript(event)
        if isinstance(event, UserTranscriptFailed):
            item = self._user_item(event.item_id, None)
            self.items.update(item)
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
                    "item": item,
                },
            ]
        if isinstance(event, ResponseStarted):
            self._transcripts[event.response_id] = ""
            self._responses[event.response_id] = event
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
            audio = self._audio(event.response_id)
            return [
                *self._announce_message(event.response_id, event.item_id),
                {
                    "type": "response.output_audio_transcript.delta"
                    if audio
                    else "response.output_text.delta",
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
            return [error_event("server_error", event.code, event.message)]
        raise AssertionError(f"unhandled session event {event!r}")

    def _user_transcript(self, event: UserTranscript) -> list[JsonDict]:
        item = self._user_item(event.item_id, event.transcript if self._transcription else None)
        self.items.update(item)
        completed = {
            "type": "conversation.item.input_audio_transcription.completed",
            "item_id": event.item_id,
            "content_index": 0,
            "transcript": event.transcript,
            "usage": {"type": "duration", "seconds": 0},
        }
        return [
            *([completed] if self._transcription else []),
            {
                "type": "conversation.item.done",
                "previous_item_id": self._previous.pop(event.item_id, None),
                "item": item,
            },
        ]

    def _audio(self, response_id: str) -> bool:
        started = self._responses.get(response_id)
        return started is None or started.audio

    def _in_conversation(self, response_id: str) -> bool:
        started = self._responses.get(response_id)
        return started is None or started.in_conversation

    def _part(self, response_id: str, text: str) -> JsonDict:
        if self._audio(response_id):
            return {"type": "audio", "transcript": text}
        return {"type": "text", "text": text}

    def _announce_message(self, response_id: str, item_id: str) -> list[JsonDict]:
        """The reply's message item, output 0, the first time it is needed;
        an out-of-band reply's items never join the conversation."""
        if response_id in self._announced:
            return []
        self._announced.add(response_id)
        item = self._assistant_item(item_id, "in_progress", None, self._audio(response_id))
        ref = {
            "response_id": response_id,
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
        }
        added = []
        if self._in_conversation(response_id):
            previous = self._place_item(item, busy=True)
            added = [
                {"type": "conversation.item.added", "previous_item_id": previous, "item": item}
            ]
        return [
            {
                "type": "response.output_item.added",
                "response_id": response_id,
                "output_index": 0,
                "item": item,
            },
            *added,
            {"type": "response.content_part.added", **ref, "part": self._part(response_id, "")},
        ]

    def _function_call(self, event: FunctionCallRequested) -> list[JsonDict]:
        # Told after the message item is done (GA order); the session hands
        # calls over right before the reply finishes.
        self._calls.setdefault(event.response_id, []).append(event)
        return []

    def _call_events(self, calls: list[FunctionCallRequested], first: int) -> list[JsonDict]:
        events: list[JsonDict] = []
        for index, call in enumerate(calls, start=first):
            if not self._in_conversation(call.response_id):
                events += [
                    e
                    for e in tool_items.function_call_events(call, index, None)
                    if not e["type"].startswith("conversation.")
                ]
                continue
            previous = self._place_item(tool_items.function_call_item(call, "completed"))
            self._previous.pop(call.item_id, None)
            events += tool_items.function_call_events(call, index, previous)
        return events

    def _response_finished(self, event: ResponseFinished) -> list[JsonDict]:
        try:
            return self._finished_events(event)
        finally:
            self._responses.pop(event.response_id, None)

    def _finished_events(self, event: ResponseFinished) -> list[JsonDict]:
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
        audio = self._audio(event.response_id)
        item_status = "completed" if event.status == "completed" else "incomplete"
        item = self._assistant_item(event.item_id, item_status, event.transcript, audio)
        response = self._response_object(
            event.response_id,
            event.status,
            output=[item, *call_items],
            metadata=self._metadata(event),
        )
        response["status_details"] = self._status_details(event)
        if audio:
            content_done = [
                {"type": "response.output_audio.done", **ref},
                {
                    "type": "response.output_audio_transcript.done",
                    **ref,
                    "transcript": event.transcript,
                },
            ]
        else:
            content_done = [{"type": "response.output_text.done", **ref, "text": event.transcript}]
        in_conversation = []
        if self._in_conversation(event.response_id):
            self.items.update(item)
            in_conversation = [
                {
                    "type": "conversation.item.done",
                    "previous_item_id": self._previous.pop(event.item_id, None),
                    "item": item,
                }
            ]
        return [
            *announce,
            *content_done,
            {
                "type": "response.content_part.done",
                **ref,
                "part": self._part(event.response_id, event.transcript),
            },
            {
                "type": "response.output_item.done",
                "response_id": event.response_id,
                "output_index": 0,
                "item": item,
            },
            *in_conversation,
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
        """The turn's latency record, with the client's own metadata (which
        wins where their keys meet)."""
        started = self._responses.get(event.response_id)
        asked = dict(started.metadata) if started and started.metadata else {}
        if event.metrics is None:
            return asked or None
        # Metadata values are strings in the Realtime schema.
        metadata = {k: str(v) for k, v in event.metrics.record().items() if v is not None}
        metadata["speculative"] = str(event.metrics.speculative).lower()
        return {**metadata, **asked}

    def undeliverable(self, kind: str | None, size: int) -> JsonDict:
        """The error sent in place of an event too large for the peer."""
        return {
            "event_id": new_id("event"),
            **error_event(
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
                error_event(
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
                error_event("invalid_request_error", exc.code, str(exc), exc.param, client_event_id)
            )
        except RecursionError:
            self.send(
                error_event(
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
                error_event(
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
            **self._item_events.handlers(),
            **self._input_audio.handlers(),
        }

    def _session_update(self, event: JsonDict) -> None:
        session = event.get("session")
        if not isinstance(session, dict):
            raise ClientEventError("invalid_value", "'session' must be an object", "session")
        self.apply_session_config(session)
        self.send({"type": "session.updated", "session": self.session_object()})

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

    def apply_session_config(self, session: JsonDict) -> None:
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
            self._transcription = changes.transcription
        if changes.turn is not None:
            self._set_turns(changes.turn)

    def _set_turns(self, turn: TurnSetting) -> None:
        self._eagerness = turn.eagerness
        self.session.set_turn_detection(turn.detection)

    def _item_create(self, event: JsonDict) -> None:
        """A typed user message or a function call's result joins the conversation."""
        previous_id = event.get("previous_item_id")
        if previous_id is not None and previous_id != self.items.last_id:
            raise ClientEventError(
                "unsupported_value",
                "previous_item_id: items can only be added at the end of the conversation "
                f"(after {self.items.last_id!r})",
                "previous_item_id",
            )
        item = tool_items.parse_item(event.get("item"), new_id("item"))
        if self.items.get(item.item_id) is not None:
            raise ClientEventError(
                "invalid_value", f"the conversation already has an item {item.item_id!r}", "item.id"
            )
        if isinstance(item, tool_items.FunctionOutput):
            if not self.session.add_function_output(item.call_id, item.output, item.item_id):
                raise ClientEventError(
                    "invalid_value",
                    f"no function call {item.call_id!r} is waiting for its output",
                    "item.call_id",
                )
        else:
            self.session.add_user_text(item.text, item.item_id)
        previous = self._place_item(item.json())
        self._previous.pop(item.item_id, None)
        for kind in ("conversation.item.added", "conversation.item.done"):
            self.send({"type": kind, "previous_item_id": previous, "item": item.json()})

    def _response_create(self, event: JsonDict) -> None:
        options = event.get("response") or {}
        if not isinstance(options, dict):
            raise ClientEventError("invalid_value", "'response' must be an object", "response")
        server_tools = self.session.config.tools
        request = parse_response_options(
            options,
            tuple(self.session.models.tts.voices()),
            [t.name for t in server_tools.specs] if server_tools else (),
            self.max_output_tokens,
            self.session.item_message,
        )
        if not self.session.create_response(request):
            raise ClientEventError(
                "conversation_already_has_active_response",
                "Conversation already has an active response in progress",
            )

    def _response_cancel(self, event: JsonDict) -> None:
        response_id = event.get("response_id")
        if response_id is not None and response_id not in self._responses:
            # One reply at a time: the one in progress is the only one to cancel.
            raise ClientEventError(
                "response_cancel_not_active",
                f"Cancellation failed: no active response {response_id!r}",
                "response_id",
            )
        if not self.session.cancel_response("client_cancelled"):
            raise ClientEventError(
                "response_cancel_not_active", "Cancellation failed: no active response found"
            )

    def _output_clear(self, event: JsonDict) -> None:
        self.session.clear_output()
