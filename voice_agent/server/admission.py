"""Whether a new call may start, and the claims its start holds.

Every way of starting a call (one process, the front of workers; WebRTC
offers and WebSocket sessions alike) goes through ``admitted``, which makes
the checks in order: the client address's offer rate, who is calling, the
request's body, the models and the LLM, the caller's key's calls (a slot of
the key is claimed), a free slot where calls live (claimed), and only then
the client secret is spent. Whatever was claimed, the secret included, is
given back unless the call is made: a single-use secret is used up by a
call, not by a refusal (in front of media workers the offer's full parse
is the worker's, after the spend) or a failed start, so the caller can
retry with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from aiohttp import web

from voice_agent.engine import Engine
from voice_agent.server.app_keys import ENGINE, OFFER_LIMITS, SETTINGS, SHUTTING_DOWN
from voice_agent.server.auth import AUTH, Authenticator, AuthError, Caller
from voice_agent.server.errors import Refusal, error_response
from voice_agent.server.limits import request_rate_refusal, retry_after
from voice_agent.server.place import CallPlace, Slot, Transport

RETRY_AFTER_S = "5"

Body = TypeVar("Body")


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
    """Spend the caller's client secret, now that its call has a slot
    (given back if the call is not made): a 401 if the same secret was
    spent meanwhile."""
    auth = request.app[AUTH]
    if auth.secrets.spend(caller):
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
    return shutting_down(request)


def shutting_down(request: web.Request) -> web.Response | None:
    """503 once shutdown has begun: also for a call admitted before it,
    when it is about to be made (server/drain.py)."""
    if request.app[SHUTTING_DOWN].is_set():
        return error_response(
            503, "shutting_down", "the server is shutting down", {"Retry-After": RETRY_AFTER_S}
        )
    return None


def server_full(max_calls: int) -> web.Response:
    return error_response(
        503, "server_full", f"all {max_calls} call slots are busy", {"Retry-After": RETRY_AFTER_S}
    )


@dataclass
class _Claims:
    """What an admission holds so far: a slot of the caller's key (with
    ``key_claimed``), a slot where calls live and the caller's client
    secret (``secret_spent``); all given back by ``settle`` unless the call
    was made."""

    auth: Authenticator
    caller: Caller | None = None
    key_claimed: bool = False
    slot: Slot | None = None
    secret_spent: bool = False
    call_id: str | None = None

    def made(self, call_id: str) -> None:
        assert self.slot is not None, "a call is made only in a slot"
        self.call_id = call_id
        self.slot.made(call_id)
        # The key's slot is now the call's: freed when the call ends.
        self.auth.bind_call(call_id, self.caller)

    def settle(self) -> None:
        if self.call_id is not None:
            return
        if self.slot is not None:
            self.slot.release()
        if self.key_claimed:
            self.auth.release_call(self.caller)
        if self.secret_spent:
            self.auth.secrets.give_back(self.caller)


@dataclass
class Admission(Generic[Body]):
    """A call allowed to start: who asked (None: no key required, or the
    front, which admitted it), what the request's body said, and the slot
    it holds. ``made`` once the call exists."""

    caller: Caller | None
    body: Body
    _claims: _Claims = field(repr=False)

    @property
    def slot(self) -> Slot:
        assert self._claims.slot is not None
        return self._claims.slot

    def made(self, call_id: str) -> None:
        """The call exists: its slot counts it, and its key's slot is freed when it ends."""
        self._claims.made(call_id)


@asynccontextmanager
async def admitted(
    request: web.Request,
    place: CallPlace,
    transport: Transport,
    read_body: Callable[[web.Request], Awaitable[Body]],
    headers: Mapping[str, str] | None = None,
    trusted: bool = False,
) -> AsyncIterator[Admission[Body] | web.Response]:
    """The admitted call, or the refusal to answer instead. ``read_body``
    reads what the request asks for (raising a ``Refusal`` when that is
    bad); ``headers``: where the caller's credentials are (the request's
    own by default); ``trusted``: the front admitted this call already,
    so only a slot is claimed. On leaving, whatever was claimed is given
    back unless ``Admission.made`` was called, whatever happened inside
    (a refusal, an error, the client gone)."""
    claims = _Claims(request.app[AUTH])
    try:
        yield await _admit(request, place, transport, read_body, headers, trusted, claims)
    finally:
        claims.settle()


async def _admit(
    request: web.Request,
    place: CallPlace,
    transport: Transport,
    read_body: Callable[[web.Request], Awaitable[Body]],
    headers: Mapping[str, str] | None,
    trusted: bool,
    claims: _Claims,
) -> Admission[Body] | web.Response:
    """The checks in order, each claim recorded in ``claims`` as it is made."""
    caller: Caller | None = None
    if not trusted:
        if (refused := rate_limited(request)) is not None:
            return refused
        caller, refused = authenticate(request, headers)
        if refused is not None:
            return refused
    try:
        body = await read_body(request)
    except Refusal as exc:
        return exc.response()
    if not trusted:
        if (refused := not_serving(request, request.app[ENGINE])) is not None:
            return refused
        if (refused := too_many_calls(request, caller)) is not None:
            return refused
        claims.caller, claims.key_claimed = caller, True
    slot = place.reserve(transport)
    if isinstance(slot, web.Response):
        return slot
    claims.slot = slot
    if (refused := secret_spent(request, claims.caller)) is not None:
        return refused
    claims.secret_spent = True
    return Admission(claims.caller, body, claims)
