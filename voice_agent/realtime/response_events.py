"""Server events for the assistant's responses: response.created, the reply's
message item and its content as the words arrive, the function calls it
made, and response.done.

A response keeps state across the events that tell it (how it was asked
for, whether its message item was announced yet, the calls held back
until it finishes), which the user's side of the conversation, in
server_events, has no need of; so it lives apart.
"""

from __future__ import annotations

from typing import Any

from voice_agent.realtime import tool_items
from voice_agent.realtime.items import ItemPlacement
from voice_agent.realtime.session_object import SessionSettings, modalities
from voice_agent.session.events import (
    AssistantTextDelta,
    FunctionCallRequested,
    ResponseFinished,
    ResponseStarted,
)
from voice_agent.session.session import VoiceSession

JsonDict = dict[str, Any]
# The schema knows two reasons for a cancelled response; ours map onto them.
_CANCEL_REASONS = {
    "turn_detected": "turn_detected",
    "superseded": "turn_detected",  # a newer user turn replaced it
    "client_cancelled": "client_cancelled",
    "session_closed": "client_cancelled",
}


class ResponseEvents:
    def __init__(
        self, session: VoiceSession, settings: SessionSettings, placement: ItemPlacement
    ) -> None:
        self.session = session
        self._settings = settings
        self._placement = placement
        self._transcripts: dict[str, str] = {}  # response_id -> text so far
        # How each response in progress was asked for (text only, out of band, metadata).
        self._responses: dict[str, ResponseStarted] = {}
        # response_id -> its function calls, told with (just before) response.done.
        self._calls: dict[str, list[FunctionCallRequested]] = {}
        # Responses whose message item (output 0) the client has been told about:
        # announced with the first words, so a call-only reply has none.
        self._announced: set[str] = set()

    def in_progress(self, response_id: str) -> bool:
        return response_id in self._responses

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
            "output_modalities": modalities(audio),
            "max_output_tokens": self.session.config.reply.max_tokens,
            "audio": {
                "output": {
                    "format": {"type": "audio/pcm", "rate": 24000},
                    "voice": started.voice if started and started.voice else self._settings.voice,
                }
            },
            "usage": None,
            "metadata": dict(started.metadata) if started and started.metadata else None,
            **extra,
        }

    def started(self, event: ResponseStarted) -> list[JsonDict]:
        self._transcripts[event.response_id] = ""
        self._responses[event.response_id] = event
        return [
            {
                "type": "response.created",
                "response": self._response_object(event.response_id, "in_progress"),
            }
        ]

    def text_delta(self, event: AssistantTextDelta) -> list[JsonDict]:
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
            previous = self._placement.place(item, busy=True)
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

    def function_call(self, event: FunctionCallRequested) -> list[JsonDict]:
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
            previous = self._placement.place(tool_items.function_call_item(call, "completed"))
            self._placement.done(call.item_id)
            events += tool_items.function_call_events(call, index, previous)
        return events

    def finished(self, event: ResponseFinished) -> list[JsonDict]:
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
            self._placement.log.update(item)
            in_conversation = [
                {
                    "type": "conversation.item.done",
                    "previous_item_id": self._placement.done(event.item_id),
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
