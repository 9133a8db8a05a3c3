"""One call's OpenAI Realtime (GA) protocol: session events out as server
events, client events in, over whichever transport carries the call (a
WebRTC data channel or a WebSocket).

RealtimeProtocol is what the transports hold; it only wires the parts
together, each of which does one job: server_events (and response_events)
translate session events, client_events parses and dispatches client
events, event_rate throttles a flooding client, session_object applies
session configuration and describes the session.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from voice_agent.realtime.client_events import MAX_CLIENT_EVENT_BYTES, ClientEvents
from voice_agent.realtime.errors import ClientEventError, error_event
from voice_agent.realtime.event_rate import EVENT_BURST, EVENTS_PER_SECOND, EventRate
from voice_agent.realtime.items import ItemLog, ItemPlacement
from voice_agent.realtime.server_events import ServerEvents
from voice_agent.realtime.session_object import SessionSettings
from voice_agent.session.events import SessionEvent
from voice_agent.session.ids import new_id
from voice_agent.session.session import VoiceSession

# The limits live with the code that holds to them; the transports read them here.
__all__ = [
    "EVENTS_PER_SECOND",
    "EVENT_BURST",
    "MAX_CLIENT_EVENT_BYTES",
    "MAX_UNSENT_EVENT_BYTES",
    "ClientEventError",
    "RealtimeProtocol",
]

JsonDict = dict[str, Any]
# Events queued for a client that does not read them (a data channel whose
# peer stops acknowledging, a WebSocket nobody reads): beyond this the call
# ends as "slow_client". Normal traffic keeps a few KiB queued; without a
# bound, a client asking again and again for a large item and never
# reading grows the worker until it is killed.
MAX_UNSENT_EVENT_BYTES = 4 * 1024 * 1024


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
        self._settings = SessionSettings(session, model, voice, max_output_tokens)
        # Items in the order the client was told about them, as the server holds them.
        self.items = ItemLog()
        placement = ItemPlacement(self.items)
        self._server_events = ServerEvents(session, self._settings, placement)
        self._client_events = ClientEvents(
            session, self._settings, placement, self._server_events.responses, self.send
        )
        self._event_rate = EventRate(self.send)

    # Read through: session.update changes the voice in the settings alone.
    @property
    def model(self) -> str:
        return self._settings.model

    @property
    def voice(self) -> str:
        return self._settings.voice

    @property
    def max_output_tokens(self) -> int:
        return self._settings.max_output_tokens

    @property
    def events_dropped(self) -> int:
        """Client events dropped for coming faster than EVENTS_PER_SECOND."""
        return self._event_rate.events_dropped

    # -- outbound ------------------------------------------------------------
    def send(self, event: JsonDict) -> None:
        self._send_raw({"event_id": new_id("event"), **event})

    def session_object(self) -> JsonDict:
        return self._settings.session_object()

    def send_session_created(self) -> None:
        self.send({"type": "session.created", "session": self.session_object()})

    def on_session_event(self, event: SessionEvent) -> None:
        for message in self._server_events.translate(event):
            self.send(message)

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
    def on_client_message(self, raw: str | bytes) -> None:
        """Handle one data-channel message; bad input becomes an ``error`` event."""
        if not self._event_rate.admit(raw):
            return
        self._client_events.handle(raw)

    def apply_session_config(self, session: JsonDict) -> None:
        """Apply a Realtime session object; anything this server cannot do
        is refused (ClientEventError) before any of it is applied."""
        self._settings.apply(session)
