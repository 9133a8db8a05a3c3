"""The aiohttp application every server process that faces clients has
(one process, the front of media workers, each worker): its middleware
(trusted proxies, CORS, JSON errors, API keys), limits and state, and the
routes that do not depend on where calls live (health, voices, the demo
page, the SDK, client secrets, ICE servers, the LLM proxy). The call
endpoints are ``server/call_routes.py``, over ``server/place.py``; the
whole service in one process is ``server/in_process_app.py``. Nothing
here loads the media stack (aiortc, PyAV): the front never handles media.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from aiohttp import web

from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.loop_health import LoopHealthMonitor
from voice_agent.server.access import require_api_keys
from voice_agent.server.admission import RETRY_AFTER_S, api_key_refusal
from voice_agent.server.app_keys import (
    CALLS,
    ENGINE,
    LOOP_HEALTH,
    OFFER_LIMITS,
    SETTINGS,
    SHUTTING_DOWN,
)
from voice_agent.server.auth import AUTH, Authenticator, add_client_secrets_route
from voice_agent.server.call_routes import CALLS_PATH
from voice_agent.server.errors import error_response
from voice_agent.server.forwarded import trusted_proxies_middleware
from voice_agent.server.ice_servers import add_ice_servers_route
from voice_agent.server.limits import REQUEST_LIMITS, ClientRateLimiter
from voice_agent.server.llm_proxy import ProxyLimits, add_llm_proxy
from voice_agent.server.sdk import add_sdk_routes, web_dir

log = logging.getLogger(__name__)

WEB_DIR = web_dir()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def healthz(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


# A header list as a preflight sends it: field names (RFC 9110 tokens), commas.
_HEADER_LIST = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+(\s*,\s*[!#$%&'*+.^_`|~0-9A-Za-z-]+)*")


def cors_middleware(origins: list[str]) -> Any:
    allow_any = "*" in origins

    def add_headers(
        headers: MutableMapping[str, str], origin: str, asked_headers: str | None = None
    ) -> None:
        """``asked_headers``: a preflight's request headers (None: no preflight)."""
        headers["Access-Control-Allow-Origin"] = "*" if allow_any else origin
        headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
        # An allowed origin may send whatever headers its preflight asks for
        # (OpenAI's SDKs add X-OpenAI-Agents-SDK, OpenAI-Beta, X-Stainless-*).
        headers["Access-Control-Allow-Headers"] = asked_headers or "Authorization, Content-Type"
        # Retry-After is not CORS-safelisted: without this, pages on other
        # origins never learn how long a full server asks them to wait.
        headers["Access-Control-Expose-Headers"] = "Location, Retry-After"
        headers["Access-Control-Max-Age"] = "600"
        vary = [] if allow_any else ["Origin"]
        if asked_headers is not None:
            vary.append("Access-Control-Request-Headers")
        if vary:
            headers["Vary"] = ", ".join(vary)

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        allowed = origin is not None and (allow_any or origin in origins)
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            response: web.StreamResponse = web.Response(status=204 if allowed else 403)
            asked = request.headers.get("Access-Control-Request-Headers", "").strip()
            if allowed and origin is not None:
                add_headers(
                    response.headers, origin, asked if _HEADER_LIST.fullmatch(asked) else ""
                )
                return response
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                # aiohttp wants HTTP errors raised, not returned: decorate and re-raise.
                if allowed and origin is not None:
                    add_headers(exc.headers, origin)
                raise
        if allowed and origin is not None:
            add_headers(response.headers, origin)
        return response

    return middleware


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The errors aiohttp answers itself (no such route, a method a route
    does not take) in the same JSON shape as ours, and a bug of ours as a
    JSON 500 rather than aiohttp's text page."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = exc.reason.lower().replace(" ", "_")
        kept = {
            k: v
            for k, v in exc.headers.items()
            if k.lower() not in ("content-type", "content-length")
        }
        message = f"{exc.reason}: {request.method} {request.path[:100]}"
        return error_response(exc.status, code, message, kept)
    except ConnectionError:  # the client is gone: nobody to answer
        raise
    except Exception:
        log.exception("request failed", extra={"method": request.method, "path": request.path})
        return error_response(500, "internal_error", "the server failed to handle this request")


async def index(request: web.Request) -> web.StreamResponse:
    if WEB_DIR is None:
        return error_response(404, "not_found", "this installation has no demo page")
    return web.FileResponse(WEB_DIR / "index.html")


def new_app(settings: Settings) -> web.Application:
    """An application with the middleware, limits and state every server
    process that faces clients has (one process, or the front of workers)."""
    # aiohttp's own body limit sits above ours so oversized offers get our 413.
    app = web.Application(
        middlewares=[
            trusted_proxies_middleware(settings.trusted_proxies),
            cors_middleware(settings.cors_origins),
            json_errors,
            require_api_keys,
        ],
        client_max_size=settings.max_offer_bytes * 2,
    )
    app[SETTINGS] = settings
    app[AUTH] = Authenticator.from_settings(settings)
    app[OFFER_LIMITS] = ClientRateLimiter(settings.offers_per_minute)
    app[REQUEST_LIMITS] = ClientRateLimiter(settings.requests_per_minute_per_key)
    app[SHUTTING_DOWN] = asyncio.Event()
    # Every process that runs a loop for clients watches it (the front too).
    loop_health = app[LOOP_HEALTH] = LoopHealthMonitor(settings.loop_stall_ms / 1000.0)
    app.cleanup_ctx.append(lambda _app: loop_health.run())
    return app


def new_runner(app: web.Application) -> web.AppRunner:
    """How every server of this service runs an application. A client that
    goes away cancels its handler: the LLM proxy then ends the upstream
    request at once (even before its first byte), a forwarded offer ends the
    worker's handler, a speech request leaves the model's queue."""
    return web.AppRunner(app, handle_signals=False, access_log=None, handler_cancellation=True)


async def voices(request: web.Request) -> web.StreamResponse:
    """The voices a session may choose (session.update's audio.output.voice)."""
    catalog = request.app[ENGINE].voice_catalog()
    if not catalog:
        return error_response(
            503, "loading", "the models are still loading", {"Retry-After": RETRY_AFTER_S}
        )
    return web.json_response({"object": "list", "data": catalog})


def add_shared_routes(app: web.Application, settings: Settings, engine: Engine) -> None:
    """Health, the voices, the demo page, the SDK and the LLM proxy."""
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/v1/voices", voices)
    app.router.add_get("/", index)
    add_client_secrets_route(app)
    add_ice_servers_route(app)
    if settings.enable_llm_proxy:
        limits = ProxyLimits(
            settings.llm_proxy_max_body_bytes,
            settings.llm_proxy_max_tokens,
            settings.llm_proxy_max_concurrent,
        )
        add_llm_proxy(app, lambda: engine.llm_config, limits, api_key_refusal)
    if WEB_DIR is not None:
        app.router.add_static("/web/", WEB_DIR, show_index=False)
        add_sdk_routes(app, WEB_DIR)


__all__ = [
    "CALLS",
    "CALLS_PATH",
    "LOOP_HEALTH",
    "RETRY_AFTER_S",
    "SETTINGS",
    "add_shared_routes",
    "new_app",
    "new_runner",
]
