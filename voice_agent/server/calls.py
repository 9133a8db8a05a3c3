"""The set of live calls, with the admission limit."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

from voice_agent.audio.echo import EchoCanceller
from voice_agent.realtime.protocol import RealtimeProtocol
from voice_agent.rtc.outbound import PacedAudioTrack, PacingStats
from voice_agent.session.session import VoiceSession

log = logging.getLogger(__name__)


class Call(Protocol):
    """A live call, whichever transport carries it (``rtc/call.py`` for
    WebRTC, ``ws/call.py`` for a WebSocket)."""

    id: str
    output: PacedAudioTrack
    session: VoiceSession
    protocol: RealtimeProtocol
    closed: asyncio.Event
    close_reason: str | None
    echo: EchoCanceller | None  # phone legs without their own echo cancellation

    @property
    def closing(self) -> bool:
        """Its release has begun (it may not have ended yet)."""
        ...

    async def close(self, reason: str = "hangup") -> None: ...


class CallRegistry:
    def __init__(self, max_calls: int) -> None:
        self.max_calls = max_calls
        self._calls: dict[str, Call] = {}
        self._reserved = 0  # admitted, still negotiating
        self._changed = asyncio.Event()
        # Outbound pacing of calls that have ended, folded in as they end.
        self._ended = PacingStats()
        self.calls_total = 0
        self.refused_full = 0  # offers answered 503: over capacity
        self.ended: dict[str, int] = {}  # calls ended, by close reason
        # Told ("started" | "ended", call id) as calls come and go: a media
        # worker's parent keeps its own count and routing from these.
        self.listeners: list[Callable[[str, str], None]] = []

    @property
    def load(self) -> float:
        """Share of the capacity in use (calls being set up count)."""
        return (len(self._calls) + self._reserved) / self.max_calls

    def __len__(self) -> int:
        return len(self._calls)

    @property
    def full(self) -> bool:
        return len(self._calls) + self._reserved >= self.max_calls

    def reserve(self) -> bool:
        """Claim a slot before any work is done for a new call."""
        if self.full:
            return False
        self._reserved += 1
        return True

    def release_reservation(self) -> None:
        self._reserved -= 1
        self._notify()

    def add(self, call: Call) -> None:
        self._calls[call.id] = call
        self.calls_total += 1
        self._notify()
        for listener in self.listeners:
            listener("started", call.id)

    def get(self, call_id: str) -> Call | None:
        return self._calls.get(call_id)

    def discard(self, call: Call) -> None:
        if self._calls.pop(call.id, None) is not None:
            self._ended.merge(call.output.stats)
            reason = call.close_reason or "unknown"
            self.ended[reason] = self.ended.get(reason, 0) + 1
            for listener in self.listeners:
                listener("ended", call.id)
        self._notify()

    def _notify(self) -> None:
        # Wake everyone waiting on the current event, then start a fresh one.
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_for_count(self, count: int) -> None:
        """Wait until exactly ``count`` calls are live (e.g. to drain)."""
        while len(self._calls) != count:
            await self._changed.wait()

    async def wait_until_idle(self) -> None:
        """Wait until no call is live and none is being negotiated."""
        while self._calls or self._reserved:
            await self._changed.wait()

    async def wait_for_negotiations(self) -> None:
        """Wait until no call is being negotiated (each one admitted has
        become a call or been refused)."""
        while self._reserved:
            await self._changed.wait()

    def calls(self) -> list[Call]:
        return list(self._calls.values())

    def pacing(self) -> PacingStats:
        """Outbound pacing over every call, live and ended."""
        total = PacingStats()
        total.merge(self._ended)
        for call in self._calls.values():
            total.merge(call.output.stats)
        return total

    async def close_all(self, reason: str) -> None:
        calls = self.calls()
        await asyncio.gather(*(call.close(reason) for call in calls), return_exceptions=True)
