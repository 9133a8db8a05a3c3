"""Which endpoints need an API key when keys are required: every one but
the probes, the demo page with its assets and SDK, and the voice list; and
the routes that check the caller themselves (``route_marks.checks_its_own_caller``):
offers and WebSocket sessions (which take client secrets), minting, TURN
credentials, the LLM proxy, and a call's ``GET``/``DELETE`` (its maker's).

Closed by default: a route added later needs a key until it is listed
here, so an operator's counters (``/v1/stats``: key ids, the LLM's URL and
its errors; ``/metrics``; ``/debug``) are never open by oversight.

``--metrics-port`` is the exception a scraper needs: that second port
serves ``/metrics`` without a key and nothing else.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from voice_agent.server.admission import RETRY_AFTER_S
from voice_agent.server.app_keys import SETTINGS
from voice_agent.server.auth import AUTH, AuthError
from voice_agent.server.errors import error_response
from voice_agent.server.route_marks import checks_own_caller

OPEN_PATHS = frozenset({"/healthz", "/readyz", "/", "/v1/voices"})
OPEN_PREFIXES = ("/web/", "/sdk/")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _open(request: web.Request) -> bool:
    path = request.path
    if request.method == "OPTIONS" or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
        return True
    match = request.match_info
    # No such route (404/405): nothing to protect, and aiohttp says so.
    return match.http_exception is not None or checks_own_caller(match.handler)


def _local_port(request: web.Request) -> int | None:
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return sockname[1] if isinstance(sockname, tuple) and len(sockname) >= 2 else None


@web.middleware
async def require_api_keys(request: web.Request, handler: Handler) -> web.StreamResponse:
    metrics_port = request.app[SETTINGS].metrics_port
    if metrics_port and _local_port(request) == metrics_port:
        if request.path != "/metrics":
            return error_response(404, "not_found", "this port serves only /metrics")
        return await handler(request)
    auth = request.app[AUTH]
    if not auth.required or _open(request) or auth.has_key(request.headers):
        return await handler(request)
    auth.refused["unauthorized"] += 1
    return error_response(401, "invalid_api_key", "this endpoint needs an API key")


def probe_response(request: web.Request, body: dict[str, Any]) -> web.Response:
    """A readiness answer: 200 when ``body["status"]`` is ready, else 503
    with Retry-After. A probe without a key is told only ready or not and
    why in one word; the rest (the LLM's URL and errors, the load) only
    with a key."""
    if not request.app[AUTH].has_key(request.headers):
        body = {k: body[k] for k in ("status", "ready") if k in body}
    if body["status"] == "ready":
        return web.json_response(body)
    return web.json_response(body, status=503, headers={"Retry-After": RETRY_AFTER_S})


def manager_refusal(request: web.Request, call_id: str) -> web.Response | None:
    """401/404 unless the request may see or end this call (its maker)."""
    try:
        request.app[AUTH].check_manager(call_id, request.headers)
    except AuthError as exc:
        return error_response(exc.status, exc.code, str(exc))
    return None
