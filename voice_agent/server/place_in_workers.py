"""Calls that live in the media workers behind the front (``--workers N``).

The front admits every call (``server/admission.py``), then hands it to
the least-loaded worker: an offer is forwarded, and the worker's answer
relayed; a WebSocket session is relayed frame by frame. From then on a
WebRTC call's media flows between the client and its worker directly. A
call's id names its worker, so its ``GET`` and ``DELETE`` reach the
owner. Stats are the workers' summed, metrics the workers' merged with
the front's own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import aiohttp
from aiohttp import WSCloseCode, web

from voice_agent.backends.capabilities import ReportsStats
from voice_agent.capacity import turn_cost_figures
from voice_agent.engine import Engine
from voice_agent.server.admission import RETRY_AFTER_S, Admission, server_full
from voice_agent.server.app_keys import SETTINGS
from voice_agent.server.call_routes import CALLS_PATH
from voice_agent.server.errors import error_response
from voice_agent.server.metrics import merge, scrape
from voice_agent.server.offers import Offer
from voice_agent.server.place import CallPlace, LiveStats, Slot, Transport
from voice_agent.server.websocket import (
    CALL_ID_HEADER,
    MAX_FRAME_BYTES,
    REALTIME_PATH,
    SESSION_HEADER,
    SUBPROTOCOL,
)
from voice_agent.server.worker_pool import Worker, WorkerPool
from voice_agent.server.worker_stats import (
    add_worker_lines,
    merge_pacing,
    merge_stt,
    worker_stats,
)
from voice_agent.session.ids import new_id
from voice_agent.ws.closing import SLOW_CLIENT_CLOSE_CODE, close_client_websocket
from voice_agent.ws.relay import RelayEnd, relay_frames

log = logging.getLogger(__name__)

# Every other request to a worker, whole: a worker that hangs (stopped, or
# its loop stalled) must not hold the client's request, and its slot, for
# ever. An offer's answer includes gathering ICE candidates (about a
# second with TURN); a hang-up or a look-up is local.
WORKER_OFFER_TIMEOUT = aiohttp.ClientTimeout(total=30, sock_connect=5)
WORKER_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=5)
# Headers of a worker's answer that mean something to the client.
FORWARDED_HEADERS = ("Location", "Retry-After")
# What a client is told when no worker is up to take its call.
NO_WORKER: dict[Transport, str] = {
    "webrtc": "no media worker is running (one is being restarted)",
    "websocket": "no media worker can take the call",
}


def _unavailable(message: str) -> web.Response:
    return error_response(503, "workers_unavailable", message, {"Retry-After": RETRY_AFTER_S})


class WorkerSlot(Slot):
    """A slot on one worker, counted there as reserved until the worker
    reports the call started (or the call is not made). A worker that died
    meanwhile had its reservations zeroed: the slot then settles nothing,
    or it would take one from the calls reserved on the new process."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self._process = worker.process

    def made(self, call_id: str) -> None:
        if self.worker.process is self._process:
            self.worker.answered(call_id)

    def release(self) -> None:
        if self.worker.process is self._process:
            self.worker.release()


def _worker(admission: Admission[Any]) -> Worker:
    slot = admission.slot
    assert isinstance(slot, WorkerSlot), "admitted by this place"
    return slot.worker


class InWorkers(CallPlace):
    """Where calls live with ``--workers``: the pool's workers."""

    def __init__(self, engine: Engine, pool: WorkerPool) -> None:
        self.engine = engine
        self.pool = pool

    # -- capacity and readiness ------------------------------------------------
    @property
    def calls(self) -> int:
        return self.pool.calls

    @property
    def full(self) -> bool:
        return self.pool.full

    @property
    def refused_full(self) -> int:
        return self.pool.refused_full

    def capacity(self) -> dict[str, Any]:
        pool = self.pool
        return {
            "calls": pool.calls,
            "max_calls": pool.max_calls,
            "load": round(pool.load, 3),
            "turn_cost": turn_cost_figures(self.engine.turn_cost),
            "workers": [w.status() for w in pool.workers],
        }

    def unready(self) -> tuple[str, str] | None:
        if not self.pool.started:
            return "loading", "the media workers are starting"
        if self.pool.up == 0:
            return "workers_unavailable", "no media worker is running"
        return None

    # -- admission and calls ----------------------------------------------------
    def check_offer(self, sdp: str) -> None:
        """Nothing more here: the worker that makes the call parses the
        offer and refuses it (relayed as it is), so the front never loads
        the media stack."""

    def reserve(self, transport: Transport) -> Slot | web.Response:
        pool = self.pool
        worker = pool.reserve()
        if worker is not None and worker.http is None and transport == "websocket":
            worker.release()  # relayed at once: a worker being restarted cannot take it
            return _unavailable(NO_WORKER[transport])
        if worker is None:
            if pool.up == 0:
                return _unavailable(NO_WORKER[transport])
            pool.refused_full += 1
            return server_full(pool.max_calls)
        return WorkerSlot(worker)

    async def make_call(
        self, request: web.Request, admission: Admission[Any], offer: Offer
    ) -> web.StreamResponse:
        answer = await _forward_offer(_worker(admission), offer, request.remote)
        location = answer.headers.get("Location")
        if answer.status == 201 and location:
            admission.made(location.rsplit("/", 1)[-1])
        return answer

    async def open_websocket(
        self,
        request: web.Request,
        admission: Admission[Any],
        call_id: str | None,
        session: dict[str, Any] | None,
    ) -> web.StreamResponse:
        """Relayed to the worker: the front picks the call's id (so it
        knows whose it is at once) and hands the worker the session a
        client secret bound."""
        worker = _worker(admission)
        if worker.http is None:
            return _unavailable(NO_WORKER["websocket"])
        # The front answers the worker's pings, so the client's own go here.
        client = web.WebSocketResponse(
            protocols=(SUBPROTOCOL,),
            max_msg_size=MAX_FRAME_BYTES,
            heartbeat=request.app[SETTINGS].ws_heartbeat_s,
        )
        if not client.can_prepare(request).ok:  # before a worker makes a call for it
            return error_response(400, "not_a_websocket", "this endpoint takes a WebSocket upgrade")
        call_id = new_id(f"rtc_w{worker.index}")
        headers = {CALL_ID_HEADER: call_id}
        if session is not None:
            headers[SESSION_HEADER] = json.dumps(session, separators=(",", ":"))
        try:
            async with asyncio.timeout(WORKER_REQUEST_TIMEOUT.total):  # the handshake only
                upstream = await worker.http.ws_connect(
                    worker.base_url + REALTIME_PATH, headers=headers, max_msg_size=MAX_FRAME_BYTES
                )
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("websocket not relayed", extra={"worker": worker.index, "error": str(exc)})
            return _unavailable(f"media worker {worker.index} did not answer")
        admission.made(call_id)
        transport = request.transport  # aiohttp lets go of it once closing
        ended: RelayEnd = "client_gone"
        try:
            await client.prepare(request)
            ended = await relay_frames(client, upstream)
            if ended == "slow_client":
                log.warning("client not reading its events; ending the call", extra={"id": call_id})
        finally:
            # Ends the worker's call, if the client went first; one ended for
            # not reading is recorded as such there.
            slow = ended == "slow_client"
            await upstream.close(code=SLOW_CLIENT_CLOSE_CODE if slow else WSCloseCode.OK)
            # Bounded: until it returns, the admission holds the call's slot.
            await close_client_websocket(client, transport)
        return client

    async def describe_call(self, call_id: str) -> web.StreamResponse | None:
        """What the owner says (it knows the echo cancellation), or only
        that the call is live (the pool hears of every start and end)."""
        worker = self.pool.owner(call_id)
        if worker is None or call_id not in worker.live:
            return None
        if worker.http is None:
            return web.json_response({"id": call_id, "status": "active"})
        try:
            async with worker.http.get(
                f"{worker.base_url}{CALLS_PATH}/{call_id}", timeout=WORKER_REQUEST_TIMEOUT
            ) as answer:
                return await _relay(answer)
        except (aiohttp.ClientError, TimeoutError):
            return web.json_response({"id": call_id, "status": "active"})

    async def end_call(self, call_id: str) -> web.StreamResponse | None:
        worker = self.pool.owner(call_id)
        if worker is None or worker.http is None or not worker.knows(call_id):
            return None
        try:
            async with worker.http.delete(
                f"{worker.base_url}{CALLS_PATH}/{call_id}", timeout=WORKER_REQUEST_TIMEOUT
            ) as answer:
                return await _relay(answer)
        except TimeoutError:
            return _unavailable(f"media worker {worker.index} did not answer in time")
        except aiohttp.ClientError:
            return error_response(404, "call_not_found", "no such call (its worker is gone)")

    async def hold_call(
        self, call_id: str, held: bool, sending: bool = True
    ) -> web.StreamResponse | None:
        return await self._post_to_owner(call_id, "hold", {"held": held, "sending": sending})

    async def press_digits(self, call_id: str, digits: str) -> web.StreamResponse | None:
        return await self._post_to_owner(call_id, "dtmf", {"digits": digits})

    async def _post_to_owner(
        self, call_id: str, action: str, body: dict[str, Any]
    ) -> web.StreamResponse | None:
        """A call's action, posted to the worker that owns the call."""
        worker = self.pool.owner(call_id)
        if worker is None or worker.http is None or not worker.knows(call_id):
            return None
        try:
            async with worker.http.post(
                f"{worker.base_url}{CALLS_PATH}/{call_id}/{action}",
                json=body,
                timeout=WORKER_REQUEST_TIMEOUT,
            ) as answer:
                return await _relay(answer)
        except TimeoutError:
            return _unavailable(f"media worker {worker.index} did not answer in time")
        except aiohttp.ClientError:
            return error_response(404, "call_not_found", "no such call (its worker is gone)")

    # -- stats and metrics --------------------------------------------------------
    async def live_stats(self) -> LiveStats:
        """The workers' counters summed, with each worker's own line."""
        per_worker = await asyncio.gather(*(worker_stats(w) for w in self.pool.workers))
        answered = [s for s in per_worker if s is not None]
        stt = merge_stt(self.stt_counters(), answered)
        counts = {**self.capacity(), "calls_total": sum(w.get("calls_total", 0) for w in answered)}
        add_worker_lines(counts["workers"], per_worker)
        pacing = merge_pacing([w.get("pacing", {}) for w in answered])
        return LiveStats(counts=counts, pacing=pacing, stt=stt)

    def ended(self) -> dict[str, int]:
        return {}  # calls end in the workers, whose metrics say how

    def pacing_counters(self) -> dict[str, Any] | None:
        return None  # no media passes through the front

    def stt_counters(self) -> dict[str, Any]:
        stt = self.engine.models.stt if self.engine.models is not None else None
        return dict(stt.stats()) if isinstance(stt, ReportsStats) else {}

    async def exposition(self, own: bytes) -> bytes:
        expositions = {"front": own.decode()}
        up = [w for w in self.pool.workers if w.up and w.http is not None]
        scraped = await asyncio.gather(
            *(scrape(w.http, w.base_url + "/metrics") for w in up if w.http is not None)
        )
        for worker, text in zip(up, scraped, strict=True):
            if text is not None:
                expositions[f"worker-{worker.index}"] = text
        return merge(expositions)


async def _forward_offer(worker: Worker, offer: Offer, client: str | None) -> web.Response:
    body: aiohttp.FormData | str
    if offer.session is None:
        body, headers = offer.sdp, {"Content-Type": "application/sdp"}
    else:
        body = aiohttp.FormData()
        body.add_field("sdp", offer.sdp, content_type="application/sdp")
        body.add_field(
            "session",
            json.dumps(offer.session, separators=(",", ":")),
            content_type="application/json",
        )
        headers = {}
    if client:
        headers["X-Forwarded-For"] = client
    if worker.http is None:
        return _unavailable(f"media worker {worker.index} is restarting")
    try:
        # A client that goes away cancels this handler and so this request:
        # the worker's handler is cancelled in turn and releases the call.
        async with worker.http.post(
            worker.base_url + CALLS_PATH, data=body, headers=headers, timeout=WORKER_OFFER_TIMEOUT
        ) as answer:
            return await _relay(answer)
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.warning("offer not delivered", extra={"worker": worker.index, "error": str(exc)})
        return _unavailable(f"media worker {worker.index} did not answer")


async def _relay(answer: aiohttp.ClientResponse) -> web.Response:
    headers = {name: answer.headers[name] for name in FORWARDED_HEADERS if name in answer.headers}
    return web.Response(
        status=answer.status,
        body=await answer.read(),
        content_type=answer.content_type,
        headers=headers,
    )
