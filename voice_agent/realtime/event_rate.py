"""The rate at which one session's client may send events.

Every session's handlers run on the one event loop all sessions share, so a
client that floods events is throttled in its own session alone: events
over the rate are dropped before they are parsed. Kept apart from the
parsing so that a dropped event costs no more than a token-bucket check.

An event counts by what parsing it costs, not as one: parsing (and checking
the nesting of) a 256 KiB event of 87,000 empty arrays takes ~50 ms of the
loop, one of 131,000 numbers ~6 ms, a 256 KiB text ~0.3 ms, an audio chunk
less. So each 2,000 brackets and commas in it count as one more event,
counted in C before anything is parsed (those inside strings too: an upper
bound). The costliest event of 256 KiB counts ~90, under the burst: a
large one (a tool's output) is slowed, never refused for ever, and a few
may be sent at once.
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
# Brackets and commas that count as one more event (see above).
STRUCTURE_PER_EVENT = 2000


class EventRate:
    def __init__(self, send: Callable[[JsonDict], None]) -> None:
        self._send = send
        self._event_budget = TokenBucket(EVENTS_PER_SECOND, EVENT_BURST)
        self.events_dropped = 0
        self._dropped_told = 0.0  # when the client was last told of dropped events

    def admit(self, raw: str | bytes) -> bool:
        """Whether the client event ``raw`` may be handled; one that may not
        is counted as dropped."""
        if self._event_budget.take(cost(raw)) is not None:
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
                    f"more than {EVENTS_PER_SECOND} events a second (one of many "
                    f"arrays, objects or items counts as more): "
                    f"{self.events_dropped} dropped so far",
                    None,
                    None,
                )
            )


def cost(raw: str | bytes) -> int:
    """What an event counts as: one, and one more for each STRUCTURE_PER_EVENT
    brackets and commas (each a value the parser builds)."""
    if isinstance(raw, str):
        structure = raw.count("[") + raw.count("{") + raw.count(",")
    else:
        structure = raw.count(b"[") + raw.count(b"{") + raw.count(b",")
    return 1 + structure // STRUCTURE_PER_EVENT
