"""Parse the client's Realtime events and hand each to its handler.

Every way a client event can be refused ends here as one ``error`` event
answering it (its ``event_id`` echoed): too large, not JSON, not an object,
an unknown type, or a handler's ClientEventError. A bug of ours answers
with ``internal_error`` rather than taking the call down. The handlers for
the session, conversation items, responses and the output buffer live
here; the item and input-audio events bring their own (items,
input_audio).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from voice_agent import strict_json
from voice_agent.realtime import tool_items
from voice_agent.realtime.errors import ClientEventError, error_event
from voice_agent.realtime.input_audio import InputAudioEvents
from voice_agent.realtime.items import ItemEvents, ItemPlacement
from voice_agent.realtime.response_events import ResponseEvents
from voice_agent.realtime.response_options import parse_response_options
from voice_agent.realtime.session_object import SessionSettings
from voice_agent.session.ids import new_id
from voice_agent.session.session import VoiceSession

log = logging.getLogger(__name__)

JsonDict = dict[str, Any]
MAX_CLIENT_EVENT_BYTES = 256 * 1024


class ClientEvents:
    def __init__(
        self,
        session: VoiceSession,
        settings: SessionSettings,
        placement: ItemPlacement,
        responses: ResponseEvents,
        send: Callable[[JsonDict], None],
    ) -> None:
        self.session = session
        self._settings = settings
        self._placement = placement
        self._responses = responses
        self._send = send
        self._item_events = ItemEvents(session, placement.log, send)
        self._input_audio = InputAudioEvents(session, send)

    def handle(self, raw: str | bytes) -> None:
        """Handle one data-channel message; bad input becomes an ``error`` event."""
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
            self._send(
                error_event("invalid_request_error", exc.code, str(exc), exc.param, client_event_id)
            )
        except RecursionError:
            self._send(
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
            self._send(
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
        self._settings.apply(session)
        self._send({"type": "session.updated", "session": self._settings.session_object()})

    def _item_create(self, event: JsonDict) -> None:
        """A typed user message or a function call's result joins the conversation."""
        items = self._placement.log
        previous_id = event.get("previous_item_id")
        if previous_id is not None and previous_id != items.last_id:
            raise ClientEventError(
                "unsupported_value",
                "previous_item_id: items can only be added at the end of the conversation "
                f"(after {items.last_id!r})",
                "previous_item_id",
            )
        item = tool_items.parse_item(event.get("item"), new_id("item"))
        if items.get(item.item_id) is not None:
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
        previous = self._placement.place(item.json())
        self._placement.done(item.item_id)
        for kind in ("conversation.item.added", "conversation.item.done"):
            self._send({"type": kind, "previous_item_id": previous, "item": item.json()})

    def _response_create(self, event: JsonDict) -> None:
        options = event.get("response") or {}
        if not isinstance(options, dict):
            raise ClientEventError("invalid_value", "'response' must be an object", "response")
        server_tools = self.session.config.tools
        request = parse_response_options(
            options,
            tuple(self.session.models.tts.voices()),
            [t.name for t in server_tools.specs] if server_tools else (),
            self._settings.max_output_tokens,
            self.session.item_message,
        )
        if not self.session.create_response(request):
            raise ClientEventError(
                "conversation_already_has_active_response",
                "Conversation already has an active response in progress",
            )

    def _response_cancel(self, event: JsonDict) -> None:
        response_id = event.get("response_id")
        if response_id is not None and not isinstance(response_id, str):
            raise ClientEventError("invalid_type", "'response_id' must be a string", "response_id")
        if response_id is not None and not self._responses.in_progress(response_id):
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
