"""``GET /v1/realtime``: a Realtime session over a WebSocket (OpenAI's
WebSocket transport), for servers and phone gateways that do not want
WebRTC. The call itself is ``ws/call.py``.

Admission is a WebRTC offer's (``server/admission.py``): the offer rate
per address, an API key or a client secret (``Authorization: Bearer``, or
for browsers, which cannot set headers on a WebSocket, the subprotocol
``openai-insecure-api-key.KEY`` as OpenAI's own clients send it), the
models, the key's calls, a free slot. Refusals are HTTP answers before the
upgrade (401, 429, 503), so no call exists for them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from voice_agent.realtime.protocol import MAX_CLIENT_EVENT_BYTES
from voice_agent.server.admission import admitted
from voice_agent.server.app_keys import PLACE
from voice_agent.server.route_marks import checks_its_own_caller

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


async def _no_body(request: web.Request) -> None:
    """A WebSocket session's request has no body to read."""
    return None


def _from_front(request: web.Request) -> tuple[str | None, dict[str, Any] | None]:
    """The call id the front chose and the session a client secret bound."""
    bound = request.headers.get(SESSION_HEADER)
    return request.headers.get(CALL_ID_HEADER), json.loads(bound) if bound else None


@checks_its_own_caller
async def realtime_websocket(request: web.Request) -> web.StreamResponse:
    """Admit the session, then run it where calls live until it ends."""
    place, trusted = request.app[PLACE], request.app[TRUST_FRONT]
    call_id, session = _from_front(request) if trusted else (None, None)
    async with admitted(
        request, place, "websocket", _no_body, credentials(request), trusted
    ) as admission:
        if isinstance(admission, web.Response):
            return admission
        if not trusted and admission.caller is not None:
            session = admission.caller.session
        return await place.open_websocket(request, admission, call_id, session)


def add_websocket_route(app: web.Application, trust_front: bool) -> None:
    """``trust_front``: this is a media worker, whose front admitted every
    session it relays (only the front reaches its private socket)."""
    app[TRUST_FRONT] = trust_front
    app.router.add_get(REALTIME_PATH, realtime_websocket)
