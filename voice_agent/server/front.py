"""The front of ``voice-agent serve --workers N``: one port for clients, N
media worker processes behind it, the models in this process.

This process owns what must be one per service: the port, admission (the
capacity and the per-address offer limit count every worker's calls), the
models (STT and TTS served to the workers on a private Unix socket by
``server/speech_api.py``, the embedded LLM supervised as before), readiness
and the aggregated stats. An offer is validated here, then forwarded to the
least-loaded worker, which creates the peer connection: from then on media
and data-channel events flow between the client and that worker directly,
and only signaling (an offer, a DELETE) passes through here. A call's id
names its worker, so its DELETE reaches the owner.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from voice_agent.backends.capabilities import ReportsStats
from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.server.access import manager_refusal, probe_response
from voice_agent.server.admission import (
    ENGINE,
    OFFER_LIMITS,
    RETRY_AFTER_S,
    SETTINGS,
    SHUTTING_DOWN,
    secret_spent,
    server_full,
)
from voice_agent.server.app import (
    CALLS_PATH,
    LOOP_HEALTH,
    Offer,
    add_shared_routes,
    admit_offer,
    new_app,
    new_runner,
    settle_offer,
)
from voice_agent.server.auth import AUTH
from voice_agent.server.errors import error_response
from voice_agent.server.metrics import LiveState, merge, metrics_response, render, scrape
from voice_agent.server.public_url import path_prefix
from voice_agent.server.route_marks import checks_its_own_caller
from voice_agent.server.speech_api import add_speech_routes
from voice_agent.server.websocket import (
    CALL_ID_HEADER,
    MAX_FRAME_BYTES,
    REALTIME_PATH,
    SESSION_HEADER,
    SUBPROTOCOL,
    admit,
)
from voice_agent.server.worker_pool import Worker, WorkerPool
from voice_agent.session.ids import new_id

log = logging.getLogger(__name__)

POOL: web.AppKey[WorkerPool] = web.AppKey("pool", WorkerPool)
WORKER_STATS_TIMEOUT_S = 2.0
# Every other request to a worker, whole: a worker that hangs (stopped, or
# its loop stalled) must not hold the client's request, and its slot, for
# ever. An offer's answer includes gathering ICE candidates (about a
# second with TURN); a hang-up or a look-up is local.
WORKER_OFFER_TIMEOUT = aiohttp.ClientTimeout(total=30, sock_connect=5)
WORKER_REQUEST_TIMEOUT = aiohttp.ClientTimeout(total=10, sock_connect=5)
# Headers of a worker's answer that mean something to the client.
FORWARDED_HEADERS = ("Location", "Retry-After")


def _unavailable(message: str) -> web.Response:
    return error_response(503, "workers_unavailable", message, {"Retry-After": RETRY_AFTER_S})


@checks_its_own_caller
async def create_call(request: web.Request) -> web.StreamResponse:
    # Bad offers are refused here, before any worker is involved.
    offer = await admit_offer(request)
    if isinstance(offer, web.Response):
        return offer
    answer: web.Response | None = None
    try:
        answer = await _admit(request, offer)
        return answer
    finally:
        settle_offer(request, offer, answer)


async def _admit(request: web.Request, offer: Offer) -> web.Response:
    """The offer, forwarded to the least-loaded worker; 503 when none can take it."""
    pool = request.app[POOL]
    worker = pool.reserve()
    if worker is None:
        if pool.up == 0:
            return _unavailable("no media worker is running (one is being restarted)")
        pool.refused_full += 1
        return server_full(pool.max_calls)
    if (refused := secret_spent(request, offer.caller)) is not None:
        worker.release()
        return refused
    answer: web.Response | None = None
    try:
        answer = await _forward_offer(worker, offer.sdp, offer.session, request.remote)
        return answer
    finally:
        location = answer.headers.get("Location") if answer is not None else None
        if answer is not None and answer.status == 201 and location:
            worker.answered(location.rsplit("/", 1)[-1])
        else:
            worker.release()


async def _forward_offer(
    worker: Worker, sdp: str, session_config: dict[str, Any] | None, client: str | None
) -> web.Response:
    body: aiohttp.FormData | str
    if session_config is None:
        body, headers = sdp, {"Content-Type": "application/sdp"}
    else:
        body = aiohttp.FormData()
        body.add_field("sdp", sdp, content_type="application/sdp")
        body.add_field(
            "session",
            json.dumps(session_config, separators=(",", ":")),
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


@checks_its_own_caller
async def realtime_websocket(request: web.Request) -> web.StreamResponse:
    """A WebSocket session, admitted here and relayed to a worker: the
    front picks the call's id (so it knows whose it is at once) and hands
    the worker the session a client secret bound."""
    pool, auth = request.app[POOL], request.app[AUTH]
    caller, refused = await admit(request)
    if refused is not None:
        return refused
    worker = pool.reserve()
    if worker is None or worker.http is None:
        if worker is not None:
            worker.release()
        auth.release_call(caller)
        if worker is None and pool.up > 0:
            pool.refused_full += 1
            return server_full(pool.max_calls)
        return _unavailable("no media worker can take the call")
    if (refused := secret_spent(request, caller)) is not None:
        worker.release()
        auth.release_call(caller)
        return refused
    call_id = new_id(f"rtc_w{worker.index}")
    headers = {CALL_ID_HEADER: call_id}
    if caller is not None and caller.session is not None:
        headers[SESSION_HEADER] = json.dumps(caller.session, separators=(",", ":"))
    try:
        async with asyncio.timeout(WORKER_REQUEST_TIMEOUT.total):  # the handshake only
            upstream = await worker.http.ws_connect(
                worker.base_url + REALTIME_PATH, headers=headers, max_msg_size=MAX_FRAME_BYTES
            )
    except (aiohttp.ClientError, TimeoutError) as exc:
        worker.release()
        auth.release_call(caller)
        log.warning("websocket not relayed", extra={"worker": worker.index, "error": str(exc)})
        return _unavailable(f"media worker {worker.index} did not answer")
    worker.answered(call_id)
    auth.bind_call(call_id, caller)
    # The front answers the worker's pings, so the client's own go here.
    client = web.WebSocketResponse(
        protocols=(SUBPROTOCOL,),
        max_msg_size=MAX_FRAME_BYTES,
        heartbeat=request.app[SETTINGS].ws_heartbeat_s,
    )
    try:
        await client.prepare(request)
        await _relay_frames(client, upstream)
    finally:
        await upstream.close()  # ends the worker's call, if the client went first
        await client.close()
    return client


async def _relay_frames(
    client: web.WebSocketResponse, upstream: aiohttp.ClientWebSocketResponse
) -> None:
    async def pipe(
        source: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
        sink: web.WebSocketResponse | aiohttp.ClientWebSocketResponse,
    ) -> None:
        async for message in source:
            if message.type == aiohttp.WSMsgType.TEXT:
                await sink.send_str(message.data)
            elif message.type == aiohttp.WSMsgType.BINARY:
                await sink.send_bytes(message.data)
            else:
                return

    both = [
        asyncio.create_task(pipe(client, upstream)),
        asyncio.create_task(pipe(upstream, client)),
    ]
    try:
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in both:
            task.cancel()
        await asyncio.gather(*both, return_exceptions=True)


@checks_its_own_caller
async def delete_call(request: web.Request) -> web.StreamResponse:
    if (refused := manager_refusal(request, request.match_info["call_id"])) is not None:
        return refused
    call_id = request.match_info["call_id"]
    worker = request.app[POOL].owner(call_id)
    if worker is None or worker.http is None:
        return error_response(404, "call_not_found", "no such call")
    try:
        async with worker.http.delete(
            f"{worker.base_url}{CALLS_PATH}/{call_id}", timeout=WORKER_REQUEST_TIMEOUT
        ) as answer:
            return await _relay(answer)
    except TimeoutError:
        return _unavailable(f"media worker {worker.index} did not answer in time")
    except aiohttp.ClientError:
        return error_response(404, "call_not_found", "no such call (its worker is gone)")


@checks_its_own_caller
async def get_call(request: web.Request) -> web.StreamResponse:
    """Whether a call is still live (the pool hears of every start and end)."""
    if (refused := manager_refusal(request, request.match_info["call_id"])) is not None:
        return refused
    call_id = request.match_info["call_id"]
    worker = request.app[POOL].owner(call_id)
    if worker is None or call_id not in worker.live:
        return error_response(404, "call_not_found", "no such call")
    if worker.http is None:
        return web.json_response({"id": call_id, "status": "active"})
    try:  # the worker that owns the call knows its details (echo cancellation)
        async with worker.http.get(
            f"{worker.base_url}{CALLS_PATH}/{call_id}", timeout=WORKER_REQUEST_TIMEOUT
        ) as answer:
            return await _relay(answer)
    except (aiohttp.ClientError, TimeoutError):
        return web.json_response({"id": call_id, "status": "active"})


def _capacity(pool: WorkerPool) -> dict[str, Any]:
    return {
        "calls": pool.calls,
        "max_calls": pool.max_calls,
        "load": round(pool.load, 3),
        "workers": [w.status() for w in pool.workers],
    }


async def readyz(request: web.Request) -> web.StreamResponse:
    """Ready when a call would be served: models loaded, the LLM able to
    answer, a media worker up, a slot free."""
    engine, pool = request.app[ENGINE], request.app[POOL]
    body: dict[str, Any] = {"ready": engine.ready, **_capacity(pool), "llm": engine.llm_health()}
    if request.app[SHUTTING_DOWN].is_set():
        body["status"] = "draining"
    elif not engine.ready or not pool.started:
        loading = engine.models is None or engine.ready
        body.update(
            status="loading" if loading else "llm_unavailable",
            reason=engine.unready_reason or "the media workers are starting",
        )
    elif pool.up == 0:
        body.update(status="workers_unavailable", reason="no media worker is running")
    else:
        body["status"] = "full" if pool.full else "ready"
    return probe_response(request, body)


async def _worker_stats(worker: Worker) -> dict[str, Any] | None:
    if not worker.up or worker.http is None:
        return None
    try:
        async with asyncio.timeout(WORKER_STATS_TIMEOUT_S):
            async with worker.http.get(worker.base_url + "/v1/stats") as answer:
                body: dict[str, Any] = await answer.json()
                return body
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def merge_pacing(parts: list[dict[str, Any]]) -> dict[str, Any]:
    counters = ("frames", "audio_frames", "late_over_20ms", "resyncs")
    merged: dict[str, Any] = {key: sum(p.get(key, 0) for p in parts) for key in counters}
    merged["max_late_ms"] = max((p.get("max_late_ms", 0.0) for p in parts), default=0.0)
    return merged


def merge_end_of_turn(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The workers' end-of-turn verdicts, summed (their times stay per worker)."""
    decisions: Counter[str] = Counter()
    for part in parts:
        decisions.update(part.get("decisions", {}))
    return {"decisions": dict(decisions)}


def merge_hearing(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The workers' redecoded and unheard turns, summed (sessions live there)."""
    merged: dict[str, Any] = {"redecoded": Counter(), "unheard": Counter(), "loops_cut": 0}
    for part in parts:
        merged["redecoded"].update(part.get("redecoded", {}))
        merged["unheard"].update(part.get("unheard", {}))
        merged["loops_cut"] += part.get("loops_cut", 0)
    return {**merged, "redecoded": dict(merged["redecoded"]), "unheard": dict(merged["unheard"])}


async def stats(request: web.Request) -> web.StreamResponse:
    """The same counters as one process serves, summed over the workers,
    plus each worker's own line."""
    engine, pool = request.app[ENGINE], request.app[POOL]
    per_worker = await asyncio.gather(*(_worker_stats(w) for w in pool.workers))
    answered = [s for s in per_worker if s is not None]
    stt = engine.models.stt if engine.models is not None else None
    stt_body: dict[str, Any] = dict(stt.stats()) if isinstance(stt, ReportsStats) else {}
    stt_body["sessions"] = [s for w in answered for s in w.get("stt", {}).get("sessions", [])]
    stt_body["hearing"] = merge_hearing([w.get("stt", {}).get("hearing", {}) for w in answered])
    stt_body["end_of_turn"] = merge_end_of_turn(
        [w.get("stt", {}).get("end_of_turn", {}) for w in answered]
    )
    body = {
        **_capacity(pool),
        "calls_total": sum(w.get("calls_total", 0) for w in answered),
        "refused_full": pool.refused_full,
        "refused_rate_limited": request.app[OFFER_LIMITS].refused,
        "auth": request.app[AUTH].stats(),
        "pacing": merge_pacing([w.get("pacing", {}) for w in answered]),
        "stt": stt_body,
        "llm": engine.llm_health(),
        "loop": request.app[LOOP_HEALTH].snapshot(),  # the front's own; each worker's below
    }
    for status, worker_stats in zip(body["workers"], per_worker, strict=True):
        if worker_stats is not None:
            status["pacing"] = worker_stats.get("pacing")
            if "loop" in worker_stats:
                status["loop"] = worker_stats["loop"]
    return web.json_response(body)


async def metrics(request: web.Request) -> web.StreamResponse:
    """The front's own metrics and every worker's, merged."""
    engine, pool = request.app[ENGINE], request.app[POOL]

    def stt() -> dict[str, Any]:
        model = engine.models.stt if engine.models is not None else None
        return dict(model.stats()) if isinstance(model, ReportsStats) else {}

    own = LiveState(
        calls=lambda: pool.calls,
        ended=dict,
        refused=lambda: {
            "server_full": pool.refused_full,
            "rate_limited": request.app[OFFER_LIMITS].refused,
            **request.app[AUTH].refused,
        },
        pacing=lambda: None,
        stt=stt,
        llm=engine.llm_health,
        loop=request.app[LOOP_HEALTH].snapshot,
    )
    expositions = {"front": render(own).decode()}
    up = [w for w in pool.workers if w.up and w.http is not None]
    scraped = await asyncio.gather(
        *(scrape(w.http, w.base_url + "/metrics") for w in up if w.http is not None)
    )
    for worker, text in zip(up, scraped, strict=True):
        if text is not None:
            expositions[f"worker-{worker.index}"] = text
    return metrics_response(merge(expositions))


def build_front_app(settings: Settings, engine: Engine, pool: WorkerPool) -> web.Application:
    app = new_app(settings)
    app[ENGINE] = engine
    app[POOL] = pool
    pool.listeners.append(app[AUTH].on_call_change)
    app.router.add_post(CALLS_PATH, create_call)
    for prefix in {"", path_prefix(settings.public_url)}:
        app.router.add_delete(prefix + CALLS_PATH + "/{call_id}", delete_call)
    app.router.add_get(CALLS_PATH + "/{call_id}", get_call)
    app.router.add_get(REALTIME_PATH, realtime_websocket)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/metrics", metrics)
    add_shared_routes(app, settings, engine)

    async def on_shutdown(app: web.Application) -> None:
        app[SHUTTING_DOWN].set()  # no new calls while the workers close theirs

    app.on_shutdown.append(on_shutdown)
    return app


class FrontServer:
    """Start-up and shutdown of the front, the speech socket and the pool,
    in order: the port answers /healthz at once; the models load; the
    speech socket opens; the workers start; then calls are taken. Shutdown
    runs the other way round."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = Engine(settings, hosts_sessions=False)
        self._runtime_dir = Path(tempfile.mkdtemp(prefix="voice-agent-"))  # mode 0700
        self.speech_socket = str(self._runtime_dir / "speech.sock")
        self.pool = WorkerPool(settings, self._runtime_dir, settings.workers)
        self._runners: list[web.AppRunner] = []

    async def listen(self) -> None:
        """Bind the client port (readiness is 503 until start() is done)."""
        app = build_front_app(self.settings, self.engine, self.pool)
        runner = new_runner(app)
        await runner.setup()
        await web.TCPSite(runner, self.settings.host, self.settings.port).start()
        if self.settings.metrics_port:  # /metrics only, no key (server/access.py)
            await web.TCPSite(runner, self.settings.host, self.settings.metrics_port).start()
        self._runners.append(runner)

    async def start(self) -> None:
        # The front faces the clients: its listen() made the first runner.
        with self._runners[-1].app[LOOP_HEALTH].starting():
            await self.engine.start()
            assert self.engine.models is not None
            speech = web.Application(client_max_size=32 * 1024 * 1024)
            add_speech_routes(speech, self.engine.models.stt, self.engine.models.tts)
            runner = new_runner(speech)
            await runner.setup()
            await web.UnixSite(runner, self.speech_socket).start()
            self._runners.insert(0, runner)  # closed after the front and the workers
            await self.pool.start(self.engine.links_for_workers(self.speech_socket))
        log.info("media workers ready", extra={"workers": self.settings.workers})

    async def drain(self) -> None:
        """No new calls here; each media worker drains its own (``server/drain.py``)."""
        front = self._runners[-1] if self._runners else None
        if front is not None:
            front.app[SHUTTING_DOWN].set()
        await self.pool.drain()

    async def stop(self) -> None:
        front = self._runners[-1] if self._runners else None
        if front is not None:
            await front.shutdown()  # SHUTTING_DOWN: no new offers
        await self.pool.stop()
        for runner in reversed(self._runners):
            await runner.cleanup()
        await self.engine.stop()
        with contextlib.suppress(OSError):
            shutil.rmtree(self._runtime_dir)
