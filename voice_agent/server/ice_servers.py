"""``GET /v1/ice-servers``: the ICE servers a client should use, with TURN
credentials minted for it on each request (``voice_agent/rtc/turn.py``).

An endpoint of its own rather than a field of the client-secret answer: a
server-side client with an API key (a SIP gateway, the Python client), a
page on a server without keys and a browser app's backend (which fetches it
next to the client secret and hands the page both) all get them the same
way, and OpenAI's client-secret shape stays as it is. It needs an API key
where offers do (a TURN relay is worth abusing); the credentials name the
key's id (without keys, the client's address), so the TURN server's logs
say whose they were, and its quotas count per key.
"""

from __future__ import annotations

from aiohttp import web

from voice_agent.rtc.turn import client_ice_servers
from voice_agent.server.app_keys import SETTINGS
from voice_agent.server.auth import AUTH, AuthError
from voice_agent.server.errors import error_response
from voice_agent.server.limits import request_rate_refusal
from voice_agent.server.route_marks import checks_its_own_caller

ICE_SERVERS_PATH = "/v1/ice-servers"


@checks_its_own_caller
async def ice_servers(request: web.Request) -> web.StreamResponse:
    try:
        caller = request.app[AUTH].identify(request.headers, allow_secret=False)
    except AuthError as exc:
        return error_response(exc.status, exc.code, str(exc))
    if (refused := request_rate_refusal(request, caller.key_id if caller else None)) is not None:
        return refused
    # Named by the key, or without keys by the client's address: each is
    # held to its own few TURN users (rtc/turn.py).
    name = caller.key_id if caller is not None else f"anon-{request.remote or 'unknown'}"
    servers, expires_at = client_ice_servers(request.app[SETTINGS], name)
    # Credentials: never kept by a cache on the way.
    return web.json_response(
        {"ice_servers": servers, "expires_at": expires_at},
        headers={"Cache-Control": "no-store"},
    )


def add_ice_servers_route(app: web.Application) -> None:
    app.router.add_get(ICE_SERVERS_PATH, ice_servers)
