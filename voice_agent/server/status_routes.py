"""``/readyz``, ``/v1/stats`` and ``/metrics``, written once over where
calls live (``server/place.py``): the engine's and this process's own
state, with the place's part (with ``--workers``, summed or merged over
the workers, each ``/metrics`` sample labelled ``process="front"`` or
``process="worker-N"``)."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from voice_agent.server.access import probe_response
from voice_agent.server.app_keys import ENGINE, LOOP_HEALTH, OFFER_LIMITS, PLACE, SHUTTING_DOWN
from voice_agent.server.auth import AUTH
from voice_agent.server.metrics import LiveState, metrics_response, render


async def readyz(request: web.Request) -> web.StreamResponse:
    """Ready only when a call would be served: models loaded, the LLM able to
    answer (a crash-looping embedded server is not), where calls live able
    to take one (with ``--workers``: started, one up), a slot free. A
    remote LLM that does not answer is shown under ``llm`` but is no
    reason to be unready: it may come back, and each call then fails with
    an apology."""
    engine, place = request.app[ENGINE], request.app[PLACE]
    body: dict[str, Any] = {"ready": engine.ready, **place.capacity(), "llm": engine.llm_health()}
    if request.app[SHUTTING_DOWN].is_set():
        body["status"] = "draining"
    elif not engine.ready:
        status = "loading" if engine.models is None else "llm_unavailable"
        body.update(status=status, reason=engine.unready_reason)
    elif (unready := place.unready()) is not None:
        body.update(status=unready[0], reason=unready[1])
    else:
        body["status"] = "full" if place.full else "ready"
    return probe_response(request, body)


async def stats(request: web.Request) -> web.StreamResponse:
    """Operational counters: live calls, refusals, how well outbound audio
    kept time, the STT, the LLM and this process's event loop."""
    app = request.app
    place = app[PLACE]
    live = await place.live_stats()
    return web.json_response(
        {
            **live.counts,
            "refused_full": place.refused_full,
            "refused_rate_limited": app[OFFER_LIMITS].refused,
            "auth": app[AUTH].stats(),
            "pacing": live.pacing,
            "stt": live.stt,
            "llm": app[ENGINE].llm_health(),
            "loop": app[LOOP_HEALTH].snapshot(),
        }
    )


async def metrics(request: web.Request) -> web.StreamResponse:
    app = request.app
    place = app[PLACE]
    own = LiveState(
        calls=lambda: place.calls,
        ended=place.ended,
        refused=lambda: {
            "server_full": place.refused_full,
            "rate_limited": app[OFFER_LIMITS].refused,
            **app[AUTH].refused,
        },
        pacing=place.pacing_counters,
        stt=place.stt_counters,
        llm=app[ENGINE].llm_health,
        loop=app[LOOP_HEALTH].snapshot,
    )
    return metrics_response(await place.exposition(render(own)))


def add_status_routes(app: web.Application) -> None:
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/metrics", metrics)
