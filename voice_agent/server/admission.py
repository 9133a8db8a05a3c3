"""Whether a new call may start: the application's state keys, and the
checks every way of starting a call makes (one process, the front of
workers; WebRTC offers and WebSocket sessions alike), in order: the
client address's offer rate, who is calling, the models and the LLM, the
caller's key's calls."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from aiohttp import web

from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.server.auth import AUTH, AuthError, Caller
from voice_agent.server.calls import CallRegistry
from voice_agent.server.errors import error_response
from voice_agent.server.limits import ClientRateLimiter, request_rate_refusal, retry_after

RETRY_AFTER_S = "5"

ENGINE: web.AppKey[Engine] = web.AppKey("engine", Engine)
CALLS: web.AppKey[CallRegistry] = web.AppKey("calls", CallRegistry)
SETTINGS: web.AppKey[Settings] = web.AppKey("settings", Settings)
# Set once shutdown begins (an Event: the app itself is frozen by then).
SHUTTING_DOWN: web.AppKey[asyncio.Event] = web.AppKey("shutting_down", asyncio.Event)
OFFER_LIMITS: web.AppKey[ClientRateLimiter] = web.AppKey("offer_limits", ClientRateLimiter)
# "rtc" in one process; "rtc_w3" in media worker 3, so its parent can route
# a call's requests to the worker that owns it.
CALL_ID_PREFIX: web.AppKey[str] = web.AppKey("call_id_prefix", str)


def rate_limited(request: web.Request) -> web.Response | None:
    """429 when this client address has offered too many calls lately.
    Checked before anything is read or parsed: a flood costs one dict
    lookup per offer."""
    wait_s = request.app[OFFER_LIMITS].take(request.remote or "unknown")
    if wait_s is None:
        return None
    return error_response(
        429,
        "rate_limited",
        f"more than {request.app[SETTINGS].offers_per_minute} offers a minute from this address",
        {"Retry-After": retry_after(wait_s)},
    )


def authenticate(
    request: web.Request, headers: Mapping[str, str] | None = None
) -> tuple[Caller | None, web.Response | None]:
    """Who is offering a call (an API key or a client secret, spent later,
    once the call has a slot), and a 401 or a per-key 429 when they may not."""
    auth = request.app[AUTH]
    try:
        caller = auth.identify(headers or request.headers, allow_secret=True)
    except AuthError as exc:
        return None, error_response(exc.status, exc.code, str(exc))
    wait_s = auth.take_offer(caller)
    if wait_s is not None:
        per_minute = request.app[SETTINGS].offers_per_minute_per_key
        message = f"more than {per_minute} offers a minute with this API key"
        return None, error_response(
            429, "rate_limited", message, {"Retry-After": retry_after(wait_s)}
        )
    return caller, None


def api_key_refusal(request: web.Request) -> web.Response | None:
    """401 unless the request carries an API key (when keys are required),
    or 429 when that key has made too many requests lately."""
    try:
        caller = request.app[AUTH].identify(request.headers, allow_secret=False)
    except AuthError as exc:
        return error_response(exc.status, exc.code, str(exc))
    return request_rate_refusal(request, caller.key_id if caller is not None else None)


def secret_spent(request: web.Request, caller: Caller | None) -> web.Response | None:
    """Spend the caller's client secret, now that its call has a slot (a
    refusal before this leaves it good for a retry): a 401 if the same
    secret was spent meanwhile."""
    auth = request.app[AUTH]
    if auth.spend(caller):
        return None
    auth.refused["unauthorized"] += 1
    return error_response(401, "invalid_client_secret", "the client secret is expired or used")


def too_many_calls(request: web.Request, caller: Caller | None) -> web.Response | None:
    """429 when the caller's key already has its most calls at once (else
    one is claimed: release it if the call is not made)."""
    if request.app[AUTH].claim_call(caller):
        return None
    limit = request.app[SETTINGS].max_calls_per_key
    return error_response(
        429,
        "too_many_calls",
        f"this API key already has {limit} calls at once",
        {"Retry-After": RETRY_AFTER_S},
    )


def not_serving(request: web.Request, engine: Engine) -> web.Response | None:
    """503 while the models load, the LLM is down, or shutdown has begun."""
    if not engine.ready or engine.models is None:
        reason = engine.unready_reason or "models are still loading"
        code = "not_ready" if engine.models is None else "llm_unavailable"
        return error_response(503, code, reason, {"Retry-After": RETRY_AFTER_S})
    if request.app[SHUTTING_DOWN].is_set():
        return error_response(
            503, "shutting_down", "the server is shutting down", {"Retry-After": RETRY_AFTER_S}
        )
    return None


def server_full(max_calls: int) -> web.Response:
    return error_response(
        503, "server_full", f"all {max_calls} call slots are busy", {"Retry-After": RETRY_AFTER_S}
    )
