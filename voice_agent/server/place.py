"""Where calls live, as the HTTP endpoints see it: in this process (a
registry of calls and the engine, ``server/place_in_process.py``) or in
the media worker processes behind the front (``server/place_in_workers.py``).

The endpoints (``server/call_routes.py``, ``server/websocket.py``,
``server/status_routes.py``) and the admission sequence
(``server/admission.py``) are written once over this interface, so both
ways of running the service refuse, answer and count the same way; only
what differs in where a call runs is a place's own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web

if TYPE_CHECKING:
    from voice_agent.server.admission import Admission
    from voice_agent.server.offers import Offer

# How a call reaches the service: a WebRTC offer or a WebSocket session.
Transport = Literal["webrtc", "websocket"]


class Slot(ABC):
    """Room for one call, claimed before any work is done for it (and
    before a client secret is spent), so concurrent offers never overfill
    the service. Settled once: the call was made, or the room is freed."""

    @abstractmethod
    def made(self, call_id: str) -> None:
        """The call exists and counts as live from now on."""

    @abstractmethod
    def release(self) -> None:
        """No call came of it: the room is free again."""


@dataclass(frozen=True)
class LiveStats:
    """The place's part of ``/v1/stats``."""

    counts: dict[str, Any]  # live calls, totals and capacity, in the place's order
    pacing: dict[str, Any]  # outbound audio timing over every call
    stt: dict[str, Any]  # the STT backend's counters and each live session's


class CallPlace(ABC):
    """The operations the call endpoints need from where calls live."""

    # -- capacity and readiness ------------------------------------------------
    @property
    @abstractmethod
    def calls(self) -> int:
        """Calls live now."""

    @property
    @abstractmethod
    def full(self) -> bool:
        """Whether every slot is taken (calls being set up count)."""

    @property
    @abstractmethod
    def refused_full(self) -> int:
        """Calls refused so far because every slot was taken."""

    @abstractmethod
    def capacity(self) -> dict[str, Any]:
        """Live calls, the most at once and the load: ``/readyz``'s part."""

    @abstractmethod
    def unready(self) -> tuple[str, str] | None:
        """Why no call can be taken here although the models and the LLM
        are ready, as (status, reason); None when one can."""

    # -- admission and calls ----------------------------------------------------
    @abstractmethod
    def reserve(self, transport: Transport) -> Slot | web.Response:
        """A slot for a new call, or the 503 that refuses it."""

    @abstractmethod
    def check_offer(self, sdp: str) -> None:
        """Refuse (an ``OfferError``) an offer no call could be made from
        here, before anything is claimed for it, beyond ``read_offer``'s
        own checks of the text (a place that cannot parse it here lets its
        call's maker refuse it, and the admission gives its claims back)."""

    @abstractmethod
    async def make_call(
        self, request: web.Request, admission: Admission[Any], offer: Offer
    ) -> web.StreamResponse:
        """The answer to an admitted WebRTC offer (201 with the SDP answer
        and Location, or the refusal); ``admission.made`` once the call exists."""

    @abstractmethod
    async def open_websocket(
        self,
        request: web.Request,
        admission: Admission[Any],
        call_id: str | None,
        session: dict[str, Any] | None,
    ) -> web.StreamResponse:
        """An admitted WebSocket session, run until it ends (``call_id``:
        the one the front chose, None to pick one; ``session``: the
        configuration a client secret bound)."""

    @abstractmethod
    async def describe_call(self, call_id: str) -> web.StreamResponse | None:
        """A live call's state; None when there is no such call."""

    @abstractmethod
    async def end_call(self, call_id: str) -> web.StreamResponse | None:
        """Hang a call up; None when there is no such call."""

    @abstractmethod
    async def hold_call(
        self, call_id: str, held: bool, sending: bool = True
    ) -> web.StreamResponse | None:
        """Put a phone call on hold or take it off, as a SIP gateway reports
        a re-INVITE; ``sending``: whether the phone will send audio (not
        after an offer of recvonly or inactive). None when there is no such
        call."""

    @abstractmethod
    async def press_digits(self, call_id: str, digits: str) -> web.StreamResponse | None:
        """Keys pressed on a phone call, as a SIP gateway reports them (SIP
        INFO); None when there is no such call."""

    # -- stats and metrics --------------------------------------------------------
    @abstractmethod
    async def live_stats(self) -> LiveStats:
        """The calls' counters, read now."""

    @abstractmethod
    def ended(self) -> dict[str, int]:
        """Calls ended in this process, by close reason."""

    @abstractmethod
    def pacing_counters(self) -> dict[str, Any] | None:
        """Outbound frames sent and sent late in this process (None: no media here)."""

    @abstractmethod
    def stt_counters(self) -> dict[str, Any]:
        """This process's STT counters (batch sizes, re-decoded turns)."""

    @abstractmethod
    async def exposition(self, own: bytes) -> bytes:
        """``/metrics`` from this process's own exposition (with the
        workers', each sample labelled by process, where there are any)."""
