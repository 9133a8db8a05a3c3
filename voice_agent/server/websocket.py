"""``GET /v1/realtime``: a Realtime session over a WebSocket (OpenAI's
WebSocket transport), for servers and phone gateways that do not want
WebRTC. The call itself is ``ws/call.py``.

Admission is a WebRTC offer's: the offer rate per address, an API key or a
client secret (``Authorization: Bearer``, or for browsers, which cannot
set headers on a WebSocket, the subprotocol ``openai-insecure-api-key.KEY``
as OpenAI's own clients send it), the models, the key's calls, a free slot.
Refusals are HTTP answers before the upgrade (401, 429, 503), so no call
exists for them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping

from aiohttp import web

from voice_agent.realtime.errors import error_event
from voice_agent.realtime.protocol import MAX_CLIENT_EVENT_BYTES, ClientEventError
from voice_agent.server.admission import (
    CALL_ID_PREFIX,
    CALLS,
    ENGINE,
    RETRY_AFTER_S,
    SETTINGS,
    authenticate,
    not_serving,
    rate_limited,
    secret_spent,
    too_many_calls,
)
from voice_agent.server.auth import AUTH, Caller
from voice_agent.server.errors import error_response
from voice_agent.server.route_marks import checks_its_own_caller
from voice_agent.session.ids import new_id
from voice_agent.ws.call import WebSocketCall

log = logging.getLogger(__name__)

REALTIME_PATH = "/v1/realtime"
SUBPROTOCOL = "realtime"
KEY_SUBPROTOCOL = "openai-insecure-api-key."
# From the front to a media worker (``--workers``): the call id the front
# chose and the session a client secret bound. Only workers, on their
# private socket, take them (TRUST_FRONT).
CALL_ID_HEADER = "X-Voice-Agent-Call-Id"
SESSION_HEADER = "X-Voice-Agent-Session"
TRUST_FRONT: web.AppKey[bool] = web.AppKey("trust_front", bool)
# aiohttp's own frame limit sits above the protocol's, which answers an
# oversized event with an error event instead of closing the socket.
MAX_FRAME_BYTES = 4 * MAX_CLIENT_EVENT_BYTES


def credentials(request: web.Request) -> Mapping[str, str]:
    """Request headers, with a key sent as a subprotocol turned into an
    Authorization header."""
    if "Authorization" in request.headers:
        return request.headers
    offered = request.headers.get("Sec-WebSocket-Protocol", "")
    for protocol in (p.strip() for p in offered.split(",")):
        if protocol.startswith(KEY_SUBPROTOCOL):
            return {"Authorization": f"Bearer {protocol[len(KEY_SUBPROTOCOL) :]}"}
    return request.headers


async def admit(request: web.Request) -> tuple[Caller | None, web.Response | None]:
    """The caller, or the HTTP refusal to answer instead of upgrading."""
    if (refused := rate_limited(request)) is not None:
        return None, refused
    caller, refused = authenticate(request, credentials(request))
    if refused is not None:
        return None, refused
    if (refused := not_serving(request, request.app[ENGINE])) is not None:
        return None, refused
    if (refused := too_many_calls(request, caller)) is not None:
        return None, refused
    return caller, None


@checks_its_own_caller
async def realtime_websocket(request: web.Request) -> web.StreamResponse:
    settings, engine, calls, auth = (
        request.app[SETTINGS],
        request.app[ENGINE],
        request.app[CALLS],
        request.app[AUTH],
    )
    if request.app[TRUST_FRONT]:
        caller = None
        call_id = request.headers.get(CALL_ID_HEADER) or new_id(request.app[CALL_ID_PREFIX])
        bound = request.headers.get(SESSION_HEADER)
        session_config = json.loads(bound) if bound else None
    else:
        caller, refused = await admit(request)
        if refused is not None:
            return refused
        call_id = new_id(request.app[CALL_ID_PREFIX])
        session_config = caller.session if caller is not None else None
    if not calls.reserve():
        auth.release_call(caller)
        calls.refused_full += 1
        return error_response(
            503,
            "server_full",
            f"all {calls.max_calls} call slots are busy",
            {"Retry-After": RETRY_AFTER_S},
        )
    if (refused := secret_spent(request, caller)) is not None:
        calls.release_reservation()
        auth.release_call(caller)
        return refused
    try:
        ws = web.WebSocketResponse(
            protocols=(SUBPROTOCOL,),
            max_msg_size=MAX_FRAME_BYTES,
            heartbeat=settings.ws_heartbeat_s,
        )
        await ws.prepare(request)
    except BaseException:
        calls.release_reservation()
        auth.release_call(caller)
        raise
    models = engine.models
    assert models is not None  # admitted: not_serving refuses until they are loaded
    call = WebSocketCall(
        call_id,
        settings,
        models,
        engine.session_config(),
        engine.model_name,
        engine.voice_name,
        ws,
        on_closed=calls.discard,
    )
    calls.release_reservation()
    auth.bind_call(call.id, caller)
    calls.add(call)
    if session_config is not None:
        try:
            call.protocol.apply_session_config(session_config)
        except ClientEventError as exc:
            refusal = error_event("invalid_request_error", exc.code, str(exc), exc.param)
            await ws.send_json({"event_id": new_id("event"), **refusal})
            await call.close("bad_session")
            return ws
    log.info("websocket call created", extra={"call_id": call.id, "calls": len(calls)})
    await call.run()
    return ws


def add_websocket_route(app: web.Application, trust_front: bool) -> None:
    app[TRUST_FRONT] = trust_front
    app.router.add_get(REALTIME_PATH, realtime_websocket)
