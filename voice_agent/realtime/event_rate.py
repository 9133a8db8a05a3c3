"""The rate at which one session's client may send events.

Every session's handlers run on the one event loop all sessions share, so a
client that floods events is throttled in its own session alone: events
over the rate are dropped before they are parsed. Kept apart from the
parsing so that a dropped event costs no more than a token-bucket check.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from voice_agent.ratelimit import TokenBucket
from voice_agent.realtime.errors import error_event

JsonDict = dict[str, Any]
# Client events one session may send: a flood is throttled in that session
# alone (its handlers run on the loop every session shares).
EVENTS_PER_SECOND = 100
EVENT_BURST = 200


class EventRate:
    def __init__(self, send: Callable[[JsonDict], None]) -> None:
        self._send = send
        self._event_budget = TokenBucket(EVENTS_PER_SECOND, EVENT_BURST)
        self.events_dropped = 0
        self._dropped_told = 0.0  # when the client was last told of dropped events

    def admit(self) -> bool:
        """Whether the next client event may be handled; one that may not
        is counted as dropped."""
        if self._event_budget.take() is not None:
            self._drop_flooded()
            return False
        return True

    def _drop_flooded(self) -> None:
        """Drop an event over the session's rate; say so at most once a
        second (an error per dropped event would feed the flood)."""
        self.events_dropped += 1
        now = time.monotonic()
        if now - self._dropped_told >= 1.0:
            self._dropped_told = now
            self._send(
                error_event(
                    "invalid_request_error",
                    "rate_limited",
                    f"more than {EVENTS_PER_SECOND} events a second: "
                    f"{self.events_dropped} dropped so far",
                    None,
                    None,
                )
            )
