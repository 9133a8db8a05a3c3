"""The endpoints of calls, written once over where calls live
(``server/place.py``): ``POST /v1/realtime/calls`` (an offer; also a WHIP
endpoint: same shape, RFC 9725), a call's ``GET``, ``DELETE``, keys
pressed and hold (its maker's only), the WebSocket session, readiness, stats and metrics."""

from __future__ import annotations

import re
from dataclasses import replace

from aiohttp import web

from voice_agent import strict_json
from voice_agent.rtc.dtmf_events import EVENTS as KEYS
from voice_agent.server.access import manager_refusal
from voice_agent.server.admission import admitted
from voice_agent.server.app_keys import PLACE, SETTINGS
from voice_agent.server.auth import with_bound_session
from voice_agent.server.caller_metadata import with_caller_metadata
from voice_agent.server.errors import error_response
from voice_agent.server.offers import Offer, read_offer
from voice_agent.server.place import CallPlace
from voice_agent.server.public_url import path_prefix
from voice_agent.server.route_marks import checks_its_own_caller
from voice_agent.server.status_routes import add_status_routes
from voice_agent.server.websocket import add_websocket_route

CALLS_PATH = "/v1/realtime/calls"
# What a call id looks like (session/ids.py: a prefix, "_", a random token).
# Checked before anything else: aiohttp decodes "%2F" into the id, and an id
# with "/" or ".." in it would reach other paths where it is put into a URL
# (a media worker's, behind the front).
CALL_ID = re.compile(r"[A-Za-z0-9_]{1,64}")
MAX_DIGITS = 32  # one request's keys: a gateway sends each INFO's key at once


@checks_its_own_caller
async def create_call(request: web.Request) -> web.StreamResponse:
    """A call from a WebRTC offer: 201 with the SDP answer and the call's
    Location, or the refusal. Bad offers are refused before anything is
    claimed for them."""
    place = request.app[PLACE]

    async def read_and_check(request: web.Request) -> Offer:
        offer = await read_offer(request)
        place.check_offer(offer.sdp)
        return offer

    async with admitted(request, place, "webrtc", read_and_check) as admission:
        if isinstance(admission, web.Response):
            return admission
        offer = admission.body
        session = with_caller_metadata(
            with_bound_session(admission.caller, offer.session),
            request.headers,
            request.app[SETTINGS].llm_instructions,
        )
        return await place.make_call(request, admission, replace(offer, session=session))


@checks_its_own_caller
async def delete_call(request: web.Request) -> web.StreamResponse:
    call_id = request.match_info["call_id"]
    if (refused := _refusal(request, call_id)) is not None:
        return refused
    answer = await request.app[PLACE].end_call(call_id)
    return answer if answer is not None else _no_such_call()


@checks_its_own_caller
async def get_call(request: web.Request) -> web.StreamResponse:
    """Whether a call is still live: how a SIP gateway learns that the
    service hung up, and sends the phone a BYE."""
    call_id = request.match_info["call_id"]
    if (refused := _refusal(request, call_id)) is not None:
        return refused
    answer = await request.app[PLACE].describe_call(call_id)
    return answer if answer is not None else _no_such_call()


@checks_its_own_caller
async def press_digits(request: web.Request) -> web.StreamResponse:
    """Keys pressed on a phone call that a SIP gateway received as SIP INFO
    (``{"digits": "12#"}``): they reach the session as RFC 4733 key presses
    do, and a press the phone also sent in the audio is heard once. Answers
    which keys were new."""
    call_id = request.match_info["call_id"]
    if (refused := _refusal(request, call_id)) is not None:
        return refused
    digits = await _body_field(request, "digits")
    if not isinstance(digits, str) or not 0 < len(digits) <= MAX_DIGITS or set(digits) - set(KEYS):
        return error_response(
            400,
            "invalid_digits",
            f'the body must be {{"digits": ...}}: 1 to {MAX_DIGITS} of {KEYS}',
        )
    answer = await request.app[PLACE].press_digits(call_id, digits)
    return answer if answer is not None else _no_such_call()


@checks_its_own_caller
async def hold_call(request: web.Request) -> web.StreamResponse:
    """A phone call put on hold (``{"held": true}``) or taken off it, as a
    SIP gateway learns from a re-INVITE: on hold the agent neither speaks
    nor listens, and the call outlives a phone that sends no audio.
    ``"sending": false`` (a phone that offered recvonly: it listens and
    sends nothing) keeps the agent speaking, and the call outlives the
    silence too."""
    call_id = request.match_info["call_id"]
    if (refused := _refusal(request, call_id)) is not None:
        return refused
    body = await _json_body(request)
    held = body.get("held") if isinstance(body, dict) else None
    sending = body.get("sending", True) if isinstance(body, dict) else None
    if not isinstance(held, bool) or not isinstance(sending, bool):
        return error_response(
            400,
            "invalid_hold",
            'the body must be {"held": true or false}, with "sending": true or false if given',
        )
    answer = await request.app[PLACE].hold_call(call_id, held, sending)
    return answer if answer is not None else _no_such_call()


def _refusal(request: web.Request, call_id: str) -> web.Response | None:
    """404 for what is no call id; else 401/404 unless the request may see
    or change this call (its maker's only)."""
    if CALL_ID.fullmatch(call_id) is None:
        return _no_such_call()
    return manager_refusal(request, call_id)


async def _json_body(request: web.Request) -> object:
    """The request's JSON body; None when it is not JSON (strict_json:
    nested too deep included, which Python's own parser fails on with a
    RecursionError)."""
    try:
        return strict_json.loads(await request.read())
    except strict_json.JsonRefused:
        return None


async def _body_field(request: web.Request, name: str) -> object:
    """One field of a JSON object body; None when the body is no such object."""
    body = await _json_body(request)
    return body.get(name) if isinstance(body, dict) else None


def _no_such_call() -> web.Response:
    return error_response(404, "call_not_found", "no such call")


def add_call_routes(app: web.Application, place: CallPlace, trust_front: bool = False) -> None:
    """Every endpoint of calls and their state, over ``place``;
    ``trust_front``: this is a media worker behind the front."""
    app[PLACE] = place
    app.router.add_post(CALLS_PATH, create_call)
    for prefix in {"", path_prefix(app[SETTINGS].public_url)}:
        app.router.add_delete(prefix + CALLS_PATH + "/{call_id}", delete_call)
    app.router.add_get(CALLS_PATH + "/{call_id}", get_call)
    app.router.add_post(CALLS_PATH + "/{call_id}/dtmf", press_digits)
    app.router.add_post(CALLS_PATH + "/{call_id}/hold", hold_call)
    add_websocket_route(app, trust_front)
    add_status_routes(app)
