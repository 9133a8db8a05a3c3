"""aiohttp application: the Realtime WebRTC endpoint (also a WHIP endpoint:
same shape, RFC 9725), health checks and the demo page.

Every request is validated before a peer connection exists, so bad input is
refused without leaving anything behind.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.http_exceptions
from aiohttp import BodyPartReader, web
from aiortc.sdp import SessionDescription

from voice_agent import strict_json
from voice_agent.audio import echo as echo_cancellation
from voice_agent.backends.capabilities import ReportsStats
from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.loop_health import LoopHealthMonitor
from voice_agent.realtime.protocol import ClientEventError
from voice_agent.rtc import decoder_hop, opus_wideband
from voice_agent.rtc.call import Call, restrict_host_addresses
from voice_agent.server.access import manager_refusal, probe_response, require_api_keys
from voice_agent.server.admission import (
    CALL_ID_PREFIX,
    CALLS,
    ENGINE,
    OFFER_LIMITS,
    RETRY_AFTER_S,
    SETTINGS,
    SHUTTING_DOWN,
    api_key_refusal,
    authenticate,
    not_serving,
    rate_limited,
    secret_spent,
    server_full,
    too_many_calls,
)
from voice_agent.server.auth import (
    AUTH,
    Authenticator,
    Caller,
    add_client_secrets_route,
    with_bound_session,
)
from voice_agent.server.caller_metadata import with_caller_metadata
from voice_agent.server.calls import CallRegistry
from voice_agent.server.debug import add_debug_routes
from voice_agent.server.drain import DRAINING
from voice_agent.server.errors import error_response
from voice_agent.server.forwarded import trusted_proxies_middleware
from voice_agent.server.ice_servers import add_ice_servers_route
from voice_agent.server.limits import REQUEST_LIMITS, ClientRateLimiter
from voice_agent.server.llm_proxy import ProxyLimits, add_llm_proxy
from voice_agent.server.metrics import LiveState, metrics_response, render
from voice_agent.server.public_url import call_location, path_prefix
from voice_agent.server.route_marks import checks_its_own_caller
from voice_agent.server.sdk import add_sdk_routes, web_dir
from voice_agent.server.sdp_check import check_offer_lines
from voice_agent.server.websocket import add_websocket_route
from voice_agent.session.ids import new_id

log = logging.getLogger(__name__)

LOOP_HEALTH: web.AppKey[LoopHealthMonitor] = web.AppKey("loop_health", LoopHealthMonitor)

CALLS_PATH = "/v1/realtime/calls"
WEB_DIR = web_dir()

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
    except Exception as exc:  # parsing the client's text: whatever fails, the text is bad
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
                parsed = strict_json.loads(data)
            except strict_json.JsonRefused as exc:
                raise OfferError(400, "invalid_session", f"'session' is not JSON: {exc}") from None
            if not isinstance(parsed, dict):
                raise OfferError(400, "invalid_session", "'session' must be a JSON object")
            session = parsed
    if sdp is None:
        raise OfferError(400, "invalid_body", "multipart body has no 'sdp' part")
    return sdp, session


@dataclass(frozen=True)
class Offer:
    """An offer that passed every check a new call passes, with a slot of
    its caller's key claimed (settle it with ``settle_offer``)."""

    sdp: str
    session: dict[str, Any] | None
    caller: Caller | None


async def admit_offer(request: web.Request) -> Offer | web.Response:
    """The offer, or the refusal: the address's rate, who is calling, the
    offer itself, the models, the caller's key's calls, in that order."""
    if (refused := rate_limited(request)) is not None:
        return refused
    caller, refused = authenticate(request)
    if refused is not None:
        return refused
    try:
        sdp, session = await read_offer(request, request.app[SETTINGS].max_offer_bytes)
    except OfferError as exc:
        return error_response(exc.status, exc.code, str(exc))
    if (refused := not_serving(request, request.app[ENGINE])) is not None:
        return refused
    if (refused := too_many_calls(request, caller)) is not None:
        return refused
    session = with_caller_metadata(
        with_bound_session(caller, session), request.headers, request.app[SETTINGS].llm_instructions
    )
    return Offer(sdp, session, caller)


def settle_offer(request: web.Request, offer: Offer, answer: web.StreamResponse | None) -> None:
    """The call the offer made counts against its key until it ends; an
    offer that made none gives its key's slot back."""
    auth = request.app[AUTH]
    location = answer.headers.get("Location") if answer is not None else None
    if answer is not None and answer.status == 201 and location:
        auth.bind_call(location.rsplit("/", 1)[-1], offer.caller)
    else:
        auth.release_call(offer.caller)


@checks_its_own_caller
async def create_call(request: web.Request) -> web.StreamResponse:
    offer = await admit_offer(request)
    if isinstance(offer, web.Response):
        return offer
    answer: web.StreamResponse | None = None
    try:
        answer = await _make_call(request, offer.sdp, offer.session, offer.caller)
        return answer
    finally:
        settle_offer(request, offer, answer)


async def _make_call(
    request: web.Request,
    sdp: str,
    session_config: dict[str, Any] | None,
    caller: Caller | None,
) -> web.StreamResponse:
    settings, engine, calls = request.app[SETTINGS], request.app[ENGINE], request.app[CALLS]
    models = engine.models
    assert models is not None
    if not calls.reserve():
        calls.refused_full += 1
        return server_full(calls.max_calls)
    if (refused := secret_spent(request, caller)) is not None:
        calls.release_reservation()
        return refused
    call: Call | None = None
    try:
        call = Call(
            new_id(request.app[CALL_ID_PREFIX]),
            settings,
            models,
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
        headers={"Location": call_location(settings.public_url, CALLS_PATH, call.id)},
    )


@checks_its_own_caller
async def delete_call(request: web.Request) -> web.StreamResponse:
    if (refused := manager_refusal(request, request.match_info["call_id"])) is not None:
        return refused
    call = request.app[CALLS].get(request.match_info["call_id"])
    if call is None:
        return error_response(404, "call_not_found", "no such call")
    await call.close("hangup")
    return web.Response(status=204)


@checks_its_own_caller
async def get_call(request: web.Request) -> web.StreamResponse:
    """Whether a call is still live: how a SIP gateway learns that the
    service hung up, and sends the phone a BYE."""
    if (refused := manager_refusal(request, request.match_info["call_id"])) is not None:
        return refused
    call = request.app[CALLS].get(request.match_info["call_id"])
    if call is None:
        return error_response(404, "call_not_found", "no such call")
    echo = call.echo
    return web.json_response(
        {
            "id": call.id,
            "status": "active",
            # What the echo canceller removed while the agent spoke (None: off).
            "echo_cancel": None if echo is None else echo.stats.as_dict(),
        }
    )


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
    if request.app[SHUTTING_DOWN].is_set():
        body["status"] = "draining"
    elif not engine.ready:
        status = "loading" if engine.models is None else "llm_unavailable"
        body.update(status=status, reason=engine.unready_reason)
    else:
        body["status"] = "full" if calls.full else "ready"
    return probe_response(request, body)


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
            "auth": request.app[AUTH].stats(),
            "pacing": {
                "frames": pacing.frames,
                "audio_frames": pacing.audio_frames,
                "late_over_20ms": pacing.late_over_20ms,
                "max_late_ms": round(pacing.max_late_ms, 2),
                "resyncs": pacing.resyncs,
            },
            "stt": stt_stats(request.app[ENGINE], calls),
            "llm": request.app[ENGINE].llm_health(),
            "loop": request.app[LOOP_HEALTH].snapshot(),
        }
    )


async def metrics(request: web.Request) -> web.StreamResponse:
    return metrics_response(render(live_state(request.app)))


def live_state(app: web.Application) -> LiveState:
    engine, calls = app[ENGINE], app[CALLS]

    def stt() -> dict[str, Any]:
        model = engine.models.stt if engine.models is not None else None
        own: dict[str, Any] = dict(model.stats()) if isinstance(model, ReportsStats) else {}
        return {**own, "hearing": engine.hearing.snapshot()}

    def pacing() -> dict[str, Any]:
        totals = calls.pacing()
        return {"frames": totals.frames, "late_over_20ms": totals.late_over_20ms}

    return LiveState(
        calls=lambda: len(calls),
        ended=lambda: dict(calls.ended),
        refused=lambda: {
            "server_full": calls.refused_full,
            "rate_limited": app[OFFER_LIMITS].refused,
            **app[AUTH].refused,
        },
        pacing=pacing,
        stt=stt,
        llm=engine.llm_health,
        loop=app[LOOP_HEALTH].snapshot,
    )


def stt_stats(engine: Engine, calls: CallRegistry) -> dict[str, object]:
    """The STT backend's own counters (batching, queue wait, inference) and
    each live session's STT latency."""
    stt = engine.models.stt if engine.models is not None else None
    body: dict[str, object] = dict(stt.stats()) if isinstance(stt, ReportsStats) else {}
    body["hearing"] = engine.hearing.snapshot()
    body["end_of_turn"] = engine.end_of_turn.snapshot()
    body["sessions"] = [{"session": c.session.id, **c.session.stt_stats()} for c in calls.calls()]
    return body


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


def build_app(
    settings: Settings, engine: Engine, call_id_prefix: str = "rtc", behind_front: bool = False
) -> web.Application:
    """The whole service in this process; with ``--workers`` each media
    worker runs one of these behind the front (``server/front.py``), which
    has admitted every call it forwards."""
    app = new_app(settings)
    restrict_host_addresses(settings.ice_host_addresses)
    decoder_hop.install()
    if settings.input_opus_16k:
        opus_wideband.available()  # finds and loads libopus now, not in a call's answer
    if settings.echo_cancel != "off":
        try:
            echo_cancellation.preload()
        except Exception:  # each call that needs it will say so
            log.exception("echo cancellation unavailable")
    app[ENGINE] = engine
    app[CALLS] = CallRegistry(settings.max_calls)
    app[DRAINING] = []
    app[CALL_ID_PREFIX] = call_id_prefix
    app[CALLS].listeners.append(app[AUTH].on_call_change)
    app.router.add_post(CALLS_PATH, create_call)
    for prefix in {"", path_prefix(settings.public_url)}:
        app.router.add_delete(prefix + CALLS_PATH + "/{call_id}", delete_call)
    app.router.add_get(CALLS_PATH + "/{call_id}", get_call)
    add_websocket_route(app, trust_front=behind_front)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/v1/stats", stats)
    app.router.add_get("/metrics", metrics)
    if settings.debug_endpoints:
        add_debug_routes(app, app[CALLS])
    add_shared_routes(app, settings, engine)

    async def on_shutdown(app: web.Application) -> None:
        app[SHUTTING_DOWN].set()  # no new calls while the live ones are closed
        await app[CALLS].close_all("server_shutdown")

    app.on_shutdown.append(on_shutdown)
    return app


__all__ = [
    "CALLS",
    "CALLS_PATH",
    "LOOP_HEALTH",
    "RETRY_AFTER_S",
    "SETTINGS",
    "Call",
    "Offer",
    "admit_offer",
    "authenticate",
    "build_app",
    "error_response",
    "not_serving",
    "rate_limited",
    "settle_offer",
    "too_many_calls",
]
