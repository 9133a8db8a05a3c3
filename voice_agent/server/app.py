"""aiohttp application: the Realtime WebRTC endpoint (also a WHIP endpoint:
same shape, RFC 9725), health checks and the demo page.

Every request is validated before a peer connection exists, so bad input is
refused without leaving anything behind.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.http_exceptions
from aiohttp import BodyPartReader, web
from aiortc.sdp import SessionDescription

from voice_agent.backends.capabilities import ReportsStats
from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.realtime.protocol import ClientEventError
from voice_agent.rtc.call import Call, restrict_host_addresses
from voice_agent.server.calls import CallRegistry
from voice_agent.server.debug import add_debug_routes
from voice_agent.server.limits import OfferRateLimiter, retry_after
from voice_agent.server.llm_proxy import add_llm_proxy
from voice_agent.server.sdk import add_sdk_routes
from voice_agent.server.sdp_check import check_offer_lines
from voice_agent.session.ids import new_id

log = logging.getLogger(__name__)

ENGINE: web.AppKey[Engine] = web.AppKey("engine", Engine)
CALLS: web.AppKey[CallRegistry] = web.AppKey("calls", CallRegistry)
SETTINGS: web.AppKey[Settings] = web.AppKey("settings", Settings)
# Set once shutdown begins (an Event: the app itself is frozen by then).
SHUTTING_DOWN: web.AppKey[asyncio.Event] = web.AppKey("shutting_down", asyncio.Event)
OFFER_LIMITS: web.AppKey[OfferRateLimiter] = web.AppKey("offer_limits", OfferRateLimiter)

CALLS_PATH = "/v1/realtime/calls"
RETRY_AFTER_S = "5"
WEB_DIR = Path(__file__).resolve().parents[2] / "web"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {
        "error": {
            "type": "rate_limit_error"
            if status == 429
            else "invalid_request_error"
            if status < 500
            else "server_error",
            "code": code,
            "message": message,
        }
    }
    return web.json_response(body, status=status, headers=headers)


class OfferError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def validate_offer(sdp: str) -> None:
    """Refuse what a peer connection would refuse, before making one."""
    if not sdp.lstrip().startswith("v=0"):
        raise OfferError(400, "invalid_sdp", "body is not an SDP offer (it must start with v=0)")
    try:
        check_offer_lines(sdp)
        parsed = SessionDescription.parse(sdp)
    except (ValueError, IndexError, KeyError, AssertionError) as exc:
        raise OfferError(400, "invalid_sdp", f"the offer could not be parsed: {exc}") from None
    audio = [media for media in parsed.media if media.kind == "audio"]
    if not audio:
        raise OfferError(400, "no_audio", "the offer has no audio media section")
    for media in audio:
        if media.ice is None or not media.ice.usernameFragment or not media.ice.password:
            raise OfferError(400, "invalid_sdp", "the audio section has no ICE credentials")
        if media.dtls is None or not media.dtls.fingerprints:
            raise OfferError(400, "invalid_sdp", "the audio section has no DTLS fingerprint")


async def read_offer(request: web.Request, limit: int) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer (and an optional session config) from either body form."""
    if request.content_length is not None and request.content_length > limit:
        raise OfferError(413, "body_too_large", f"offer larger than {limit} bytes")
    content_type = request.content_type
    if content_type == "application/sdp":
        body = await request.content.read(limit + 1)
        if len(body) > limit:
            raise OfferError(413, "body_too_large", f"offer larger than {limit} bytes")
        session = None
    elif content_type == "multipart/form-data":
        # OpenAI's alternative form: an "sdp" part and an optional "session" part.
        body, session = await _read_multipart(request, limit)
    else:
        raise OfferError(
            415, "unsupported_media_type", "send the SDP offer with Content-Type: application/sdp"
        )
    try:
        sdp = body.decode("utf-8")
    except UnicodeDecodeError:
        raise OfferError(400, "invalid_sdp", "the offer is not UTF-8 text") from None
    validate_offer(sdp)
    return sdp, session


async def _read_multipart(request: web.Request, limit: int) -> tuple[bytes, dict[str, Any] | None]:
    try:
        return await _read_parts(request, limit)
    except (
        ValueError,
        AssertionError,
        EOFError,
        aiohttp.ClientPayloadError,
        aiohttp.http_exceptions.HttpProcessingError,
    ) as exc:
        # No boundary, a broken part header, a body cut short.
        raise OfferError(400, "invalid_body", f"malformed multipart body: {exc}") from None


async def _read_parts(request: web.Request, limit: int) -> tuple[bytes, dict[str, Any] | None]:
    reader = await request.multipart()
    sdp: bytes | None = None
    session: dict[str, Any] | None = None
    total = 0
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):  # nested multipart
            raise OfferError(400, "invalid_body", "nested multipart is not supported")
        data = await part.read()
        total += len(data)
        if total > limit:
            raise OfferError(413, "body_too_large", f"offer larger than {limit} bytes")
        if part.name == "sdp":
            sdp = data
        elif part.name == "session":
            try:
                parsed = json.loads(data)
            except (ValueError, RecursionError):  # bad JSON or UTF-8, absurd nesting
                raise OfferError(400, "invalid_session", "'session' is not valid JSON") from None
            if not isinstance(parsed, dict):
                raise OfferError(400, "invalid_session", "'session' must be a JSON object")
            session = parsed
    if sdp is None:
        raise OfferError(400, "invalid_body", "multipart body has no 'sdp' part")
    return sdp, session


async def create_call(request: web.Request) -> web.StreamResponse:
    settings, engine, calls = request.app[SETTINGS], request.app[ENGINE], request.app[CALLS]
    # Before anything is read or parsed: a flood costs one dict lookup per offer.
    wait_s = request.app[OFFER_LIMITS].take(request.remote or "unknown")
    if wait_s is not None:
        return error_response(
            429,
            "rate_limited",
            f"more than {settings.offers_per_minute} offers a minute from this address",
            {"Retry-After": retry_after(wait_s)},
        )
    try:
        sdp, session_config = await read_offer(request, settings.max_offer_bytes)
    except OfferError as exc:
        return error_response(exc.status, exc.code, str(exc))
    if not engine.ready or engine.models is None:
        reason = engine.unready_reason or "models are still loading"
        code = "not_ready" if engine.models is None else "llm_unavailable"
        return error_response(503, code, reason, {"Retry-After": RETRY_AFTER_S})
    if request.app[SHUTTING_DOWN].is_set():
        return error_response(
            503, "shutting_down", "the server is shutting down", {"Retry-After": RETRY_AFTER_S}
        )
    if not calls.reserve():
        calls.refused_full += 1
        return error_response(
            503,
            "server_full",
            f"all {calls.max_calls} call slots are busy",
            {"Retry-After": RETRY_AFTER_S},
        )
    call: Call | None = None
    try:
        call = Call(
            new_id("rtc"),
            settings,
            engine.models,
            engine.session_config(),
            engine.model_name,
            engine.voice_name,
            on_closed=calls.discard,
        )
        if session_config is not None:
            try:
                call.protocol.apply_session_config(session_config)
            except ClientEventError as exc:
                await call.close("bad_session")
                return error_response(400, "invalid_session", str(exc))
        answer = await call.answer(sdp)
    except Exception as exc:
        if call is not None:
            await call.close("bad_offer")
        message = str(exc) or type(exc).__name__
        return error_response(400, "invalid_sdp", f"the offer could not be applied: {message}")
    except BaseException:  # cancelled (client gone, shutdown): release, then propagate
        if call is not None:
            await asyncio.shield(call.close("cancelled"))
        raise
    finally:
        calls.release_reservation()
    calls.add(call)
    log.info("call created", extra={"call_id": call.id, "calls": len(calls)})
    return web.Response(
        status=201,
        text=answer,
        content_type="application/sdp",
        headers={"Location": f"{CALLS_PATH}/{call.id}"},
    )


async def delete_call(request: web.Request) -> web.StreamResponse:
    call = request.app[CALLS].get(request.match_info["call_id"])
    if call is None:
        return error_response(404, "call_not_found", "no such call")
    await call.close("hangup")
    return web.Response(status=204)


async def healthz(request: web.Request) -> web.StreamResponse:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.StreamResponse:
    """Ready only when a call would be served: models loaded, the LLM able to
    answer (a crash-looping embedded server is not), a slot free. A remote
    LLM that does not answer is shown under ``llm`` but is no reason to be
    unready: it may come back, and each call then fails with an apology."""
    engine, calls = request.app[ENGINE], request.app[CALLS]
    body: dict[str, Any] = {
        "ready": engine.ready,
        "calls": len(calls),
        "max_calls": calls.max_calls,
        "load": round(calls.load, 3),
        "llm": engine.llm_health(),
    }
    if not engine.ready:
        status = "loading" if engine.models is None else "llm_unavailable"
        return web.json_response(
            {**body, "status": status, "reason": engine.unready_reason},
            status=503,
            headers={"Retry-After": RETRY_AFTER_S},
        )
    if calls.full:
        return web.json_response(
            {**body, "status": "full"}, status=503, headers={"Retry-After": RETRY_AFTER_S}
        )
    return web.json_response({**body, "status": "ready"})


async def stats(request: web.Request) -> web.StreamResponse:
    """Operational counters: live calls and how well outbound audio kept time."""
    calls = request.app[CALLS]
    pacing = calls.pacing()
    return web.json_response(
        {
            "calls": len(calls),
            "calls_total": calls.calls_total,
            "max_calls": calls.max_calls,
            "load": round(calls.load, 3),
            "refused_full": calls.refused_full,
            "refused_rate_limited": request.app[OFFER_LIMITS].refused,
            "pacing": {
                "frames": pacing.frames,
                "audio_frames": pacing.audio_frames,
                "late_over_20ms": pacing.late_over_20ms,
                "max_late_ms": round(pacing.max_late_ms, 2),
                "resyncs": pacing.resyncs,
            },
            "stt": stt_stats(request.app[ENGINE], calls),
            "llm": request.app[ENGINE].llm_health(),
        }
    )


def stt_stats(engine: Engine, calls: CallRegistry) -> dict[str, object]:
    """The STT backend's own counters (batching, queue wait, inference) and
    each live session's STT latency."""
    stt = engine.models.stt if engine.models is not None else None
    body: dict[str, object] = dict(stt.stats()) if isinstance(stt, ReportsStats) else {}
    body["sessions"] = [{"session": c.session.id, **c.session.stt_stats()} for c in calls.calls()]
    return body


def cors_middleware(origins: list[str]) -> Any:
    allow_any = "*" in origins

    def add_headers(headers: MutableMapping[str, str], origin: str) -> None:
        headers["Access-Control-Allow-Origin"] = "*" if allow_any else origin
        headers["Access-Control-Allow-Methods"] = "GET, POST, DELETE, OPTIONS"
        headers["Access-Control-Allow-Headers"] = "Authorization, Content-Type"
        # Retry-After is not CORS-safelisted: without this, pages on other
        # origins never learn how long a full server asks them to wait.
        headers["Access-Control-Expose-Headers"] = "Location, Retry-After"
        headers["Access-Control-Max-Age"] = "600"
        if not allow_any:
            headers["Vary"] = "Origin"

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        allowed = origin is not None and (allow_any or origin in origins)
        if request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers:
            response: web.StreamResponse = web.Response(status=204 if allowed else 403)
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


async def index(request: web.Request) -> web.StreamResponse:
    return web.FileResponse(WEB_DIR / "index.html")


def build_app(settings: Settings, engine: Engine) -> web.Application:
    # aiohttp's own body limit sits above ours so oversized offers get our 413.
    app = web.Application(
        middlewares=[cors_middleware(settings.cors_origins)],
        client_max_size=settings.max_offer_bytes * 2,
    )
    app[SETTINGS] = settings
    restrict_host_addresses(settings.ice_host_addresses)
    app[ENGINE] = engine
    app[CALLS] = CallRegistry(settings.max_calls)
    app[OFFER_LIMITS] = OfferRateLimiter(settings.offers_per_minute)
    app[SHUTTING_DOWN] = asyncio.Event()
    app.router.add_post(CALLS_PATH, create_call)
    app.router.add_delete(CALLS_PATH + "/{call_id}", delete_call)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/", index)
    if settings.debug_endpoints:
        add_debug_routes(app, app[CALLS])
    if settings.enable_llm_proxy:
        add_llm_proxy(app, lambda: engine.llm_config, settings.llm_proxy_max_body_bytes)
    if WEB_DIR.is_dir():
        app.router.add_static("/web/", WEB_DIR, show_index=False)
        add_sdk_routes(app, WEB_DIR)

    async def on_shutdown(app: web.Application) -> None:
        app[SHUTTING_DOWN].set()  # no new calls while the live ones are closed
        await app[CALLS].close_all("server_shutdown")

    app.on_shutdown.append(on_shutdown)
    return app


__all__ = ["Call", "build_app"]
