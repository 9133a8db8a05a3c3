"""The front of ``voice-agent serve --workers N``: one port for clients, N
media worker processes behind it, the models in this process.

This process owns what must be one per service: the port, admission (the
capacity and the per-address offer limit count every worker's calls), the
models (STT and TTS served to the workers on a private Unix socket by
``server/speech_api.py``, the embedded LLM as a supervised child), readiness
and the aggregated stats. Its call endpoints are the single process's
(``server/call_routes.py``) over the workers (``server/place_in_workers.py``):
an offer's text is checked and its call admitted here, then it is
forwarded to the least-loaded worker, which parses it as aiortc will
(relaying any refusal) and creates the peer connection; from then on media and data-channel
events flow between the client and that worker directly, and only
signaling (an offer, a DELETE) passes through here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from typing import Any

import aiohttp
from aiohttp import web

from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.memory import TRIMMER
from voice_agent.server.app import add_shared_routes, new_app, new_runner
from voice_agent.server.app_keys import ENGINE, LOOP_HEALTH, SHUTTING_DOWN
from voice_agent.server.auth import AUTH
from voice_agent.server.call_routes import add_call_routes
from voice_agent.server.debug import add_debug_routes
from voice_agent.server.place_in_workers import InWorkers
from voice_agent.server.runtime_dir import make_runtime_dir, sweep_stale_runtime_dirs
from voice_agent.server.speech_api import add_speech_routes
from voice_agent.server.worker_pool import Worker, WorkerPool, media_workers

log = logging.getLogger(__name__)


def build_front_app(settings: Settings, engine: Engine, pool: WorkerPool) -> web.Application:
    """The front's application: every call endpoint over the pool's workers."""
    app = new_app(settings)
    app[ENGINE] = engine
    pool.listeners.append(app[AUTH].on_call_change)
    add_call_routes(app, InWorkers(engine, pool))
    if settings.debug_endpoints:  # each worker has its own; the front gathers them

        async def workers_memory(types: bool) -> list[dict[str, Any]]:
            return list(await asyncio.gather(*(_worker_memory(w, types) for w in pool.workers)))

        add_debug_routes(app, lambda: pool.calls, workers_memory)
    add_shared_routes(app, settings, engine)

    async def on_shutdown(app: web.Application) -> None:
        app[SHUTTING_DOWN].set()  # no new calls while the workers close theirs

    app.on_shutdown.append(on_shutdown)
    return app


async def _worker_memory(worker: Worker, types: bool) -> dict[str, Any]:
    """A media worker's ``/debug/memory`` with its index and pid; a worker
    that is down or does not answer gives its error instead."""
    head = {"index": worker.index, "pid": worker.process.pid if worker.process else None}
    if not worker.up or worker.http is None:
        return {**head, "error": "down"}
    try:
        params = {"types": "1"} if types else {}
        timeout = aiohttp.ClientTimeout(total=30)
        async with worker.http.get(
            worker.base_url + "/debug/memory", params=params, timeout=timeout
        ) as response:
            response.raise_for_status()
            return {**head, **await response.json()}
    except (aiohttp.ClientError, TimeoutError) as exc:
        return {**head, "error": str(exc) or type(exc).__name__}


class FrontServer:
    """Start-up and shutdown of the front, the speech socket and the pool,
    in order: the port answers /healthz at once; the models load; the
    speech socket opens; the workers start; then calls are taken. Shutdown
    runs the other way round."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = Engine(settings, hosts_sessions=False)
        sweep_stale_runtime_dirs()  # what killed fronts left behind
        self._runtime_dir = make_runtime_dir()
        self.speech_socket = str(self._runtime_dir / "speech.sock")
        self.pool = WorkerPool(settings, self._runtime_dir, media_workers(settings))
        self.pool.listeners.append(self._after_call)
        self._runners: list[web.AppRunner] = []

    def _after_call(self, change: str, call_id: str) -> None:
        """A call ended in a worker: what the models here freed for it (its
        transcripts, its replies' audio) goes back to the kernel, as each
        worker does with its own (otherwise the front keeps ~90 MB more
        after its first calls, for good)."""
        if change == "ended" and self.settings.malloc_trim:
            TRIMMER.request()

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
            await self.pool.launch_ahead()
            await self.engine.start()
            # The capacity is known now (the turn's cost measured, or cached):
            # the front admits up to it, and each worker's own limit is it too.
            capacity = self.engine.max_calls
            self.pool.max_calls = capacity
            self.pool.settings = self.settings.model_copy(update={"max_calls": capacity})
            # The measured capacity can need more workers than the estimate
            # launched ahead: they start with the others below, not ahead.
            self.pool.add_workers(media_workers(self.settings, capacity) - len(self.pool.workers))
            assert self.engine.models is not None
            speech = web.Application(client_max_size=32 * 1024 * 1024)
            add_speech_routes(speech, self.engine.models.stt, self.engine.models.tts)
            runner = new_runner(speech)
            await runner.setup()
            await web.UnixSite(runner, self.speech_socket).start()
            self._runners.insert(0, runner)  # closed after the front and the workers
            await self.pool.start(self.engine.links_for_workers(self.speech_socket))
        log.info("media workers ready", extra={"workers": len(self.pool.workers)})

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
