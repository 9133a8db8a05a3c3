"""Who may call: API keys, short-lived client secrets, and per-key limits.

As OpenAI's API: a server holds an API key (``Authorization: Bearer KEY``);
a browser app's backend mints a client secret with it
(``POST /v1/realtime/client_secrets``) and hands the page that ``ek_...``
value, which the page uses for its call. A secret is bound to the session
configuration it was minted with, expires (``expires_after.seconds``, 10
minutes by default, at most 2 hours), and is good for one call: used or
expired, it is refused.

A client secret is a stateless signed token (secret_tokens.py): any
replica holding the same API keys accepts it. It is spent only once its
call has a slot (a 503 leaves it good for the retry); single use is kept
per process, so across N replicas a secret could be used once on each
within its lifetime: keep it short.

Authentication is required when keys are configured or the server listens
beyond loopback (``--auth auto``), and off only on loopback with no keys;
``--auth required`` or ``off`` say so explicitly. Keys are at least
``MIN_SECRET_CHARS`` long and never a documented placeholder. Limits per key
(offers a minute, calls at once) sit beside the per-address ones; a secret
counts against the key that minted it. A call is managed (``GET``,
``DELETE``) by the key that made it or with the secret it was made with.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from voice_agent import strict_json
from voice_agent.config import Settings, weak_secret
from voice_agent.ratelimit import TokenBucket
from voice_agent.server.callers import (
    AuthConfigError,
    AuthError,
    Caller,
    key_id,
    token_bytes,
    token_hash,
)
from voice_agent.server.errors import error_response
from voice_agent.server.limits import request_rate_refusal
from voice_agent.server.route_marks import checks_its_own_caller
from voice_agent.server.secret_tokens import (
    DEFAULT_SECRET_TTL_S,
    SECRET_PREFIX,
    ClientSecrets,
)

# Re-exported: the rest of the server imports them from here.
__all__ = [
    "AUTH",
    "AuthConfigError",
    "AuthError",
    "Authenticator",
    "Caller",
    "key_id",
    "with_bound_session",
]

log = logging.getLogger(__name__)

# Ended calls remembered in case their maker is bound after the end (a
# relayed answer races the worker's report of the end); 0.1 MB at most.
MAX_ENDED_UNBOUND = 1000

CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"
MAX_SECRET_REQUEST_BYTES = 64 * 1024


def read_keys_file(path: Path) -> list[str]:
    """One key a line; blank lines and ``#`` comments are skipped."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Authenticator:
    def __init__(
        self,
        keys: list[str],
        required: bool,
        offers_per_minute_per_key: int = 0,
        max_calls_per_key: int = 0,
    ) -> None:
        self.required = required
        self._keys = {key_id(k): k for k in keys}
        self.secrets = ClientSecrets(self._keys)
        self._offers_per_minute = offers_per_minute_per_key
        self._max_calls = max_calls_per_key
        self._buckets: dict[str, TokenBucket] = {}
        self._calls: dict[str, int] = {}
        self._owners: dict[str, Caller] = {}  # live call id -> its caller
        # Calls that ended before their maker was bound, oldest first.
        self._ended_unbound: OrderedDict[str, None] = OrderedDict()
        self.refused = {"unauthorized": 0, "rate_limited": 0, "too_many_calls": 0}

    @classmethod
    def from_settings(cls, settings: Settings) -> Authenticator:
        keys = list(settings.api_keys)
        if settings.api_keys_file:
            try:
                keys += read_keys_file(Path(settings.api_keys_file))
            except OSError as exc:
                raise AuthConfigError(f"cannot read --api-keys-file: {exc}") from None
        public = not is_loopback(settings.host)
        # Keys configured are keys enforced: on loopback too (a local proxy
        # in front forwards everyone's requests from 127.0.0.1).
        required = settings.auth == "required" or (
            settings.auth == "auto" and (public or bool(keys))
        )
        if required and not keys:
            why = (
                "--auth required"
                if settings.auth == "required"
                else (f"listening on {settings.host}, not loopback")
            )
            raise AuthConfigError(
                f"API keys are required ({why}) but none is set: pass --api-keys-file FILE "
                "or VOICE_AGENT_API_KEYS, or --auth off behind your own authentication"
            )
        for key in keys if required else ():
            weakness = weak_secret(key)
            if weakness is not None:
                raise AuthConfigError(f"an API key is {weakness} (key id {key_id(key)})")
        if required:
            log.info("authentication required", extra={"keys": len(keys), "auth": settings.auth})
        elif public:
            log.warning(
                "authentication is off on a public address: anyone who reaches it can "
                "call, mint TURN credentials and use the LLM",
                extra={"host": settings.host},
            )
        else:
            log.info("authentication off (loopback, no keys)", extra={"host": settings.host})
        return cls(keys, required, settings.offers_per_minute_per_key, settings.max_calls_per_key)

    # -- who is calling -------------------------------------------------------
    def identify(self, headers: Mapping[str, str], allow_secret: bool) -> Caller | None:
        """The caller, from ``Authorization: Bearer``; None when auth is off
        (then only a client secret's bound session is taken from a token).
        A client secret is spent here: a second use is refused."""
        token = _bearer(headers.get("Authorization", ""))
        if not self.required:
            if allow_secret and token is not None and token.startswith(SECRET_PREFIX):
                return self.secrets.unseal(token)
            return None
        if token is None:
            self.refused["unauthorized"] += 1
            raise AuthError(401, "missing_api_key", "send an API key: Authorization: Bearer KEY")
        kid = self._key_of(token)
        if kid is not None:
            return Caller(kid)
        if allow_secret and token.startswith(SECRET_PREFIX):
            caller = self.secrets.unseal(token)
            if caller is not None:
                return caller
            self.refused["unauthorized"] += 1
            raise AuthError(401, "invalid_client_secret", "the client secret is expired or used")
        self.refused["unauthorized"] += 1
        raise AuthError(401, "invalid_api_key", "the API key is not valid")

    def _key_of(self, token: str) -> str | None:
        """The id of the API key ``token`` is, compared in constant time
        (as bytes: a token with characters beyond ASCII is just wrong)."""
        given = token_bytes(token)
        found = None
        for kid, key in self._keys.items():
            if hmac.compare_digest(given, key.encode()):
                found = kid
        return found

    def has_key(self, headers: Mapping[str, str]) -> bool:
        """Whether the request carries one of the API keys (or needs none)."""
        if not self.required:
            return True
        token = _bearer(headers.get("Authorization", ""))
        return token is not None and self._key_of(token) is not None

    def check_manager(self, call_id: str, headers: Mapping[str, str]) -> None:
        """Whether this request may see or end the call: the key that made
        it, or the client secret it was made with (spent, but still its
        own). 401 without a valid token, 404 for another's call (whether
        it exists is not told)."""
        if not self.required:
            return
        token = _bearer(headers.get("Authorization", ""))
        if token is None:
            self.refused["unauthorized"] += 1
            raise AuthError(401, "missing_api_key", "send an API key: Authorization: Bearer KEY")
        owner = self._owners.get(call_id)
        kid = self._key_of(token)
        if kid is None:
            made_with = owner.secret_hash if owner is not None else None
            if made_with is not None and hmac.compare_digest(made_with, token_hash(token)):
                return
            if owner is None and token.startswith(SECRET_PREFIX):
                # Its call may have ended already (the page's hang-up comes late).
                raise AuthError(404, "call_not_found", "no such call")
            self.refused["unauthorized"] += 1
            raise AuthError(401, "invalid_api_key", "the API key is not valid")
        if owner is not None and owner.key_id != kid:
            raise AuthError(404, "call_not_found", "no such call")

    # -- client secrets ---------------------------------------------------------
    # -- per-key limits -----------------------------------------------------------
    def take_offer(self, caller: Caller | None) -> float | None:
        """Spend one offer for the caller's key: None if allowed, else the
        seconds until the next one would be."""
        if caller is None or self._offers_per_minute <= 0:
            return None
        bucket = self._buckets.get(caller.key_id)
        if bucket is None:
            rate = self._offers_per_minute / 60.0
            bucket = self._buckets[caller.key_id] = TokenBucket(rate, self._offers_per_minute)
        wait_s = bucket.take()
        if wait_s is not None:
            self.refused["rate_limited"] += 1
        return wait_s

    def claim_call(self, caller: Caller | None) -> bool:
        """One more live call for the caller's key, if under its limit."""
        if caller is None:
            return True
        calls = self._calls.get(caller.key_id, 0)
        if self._max_calls > 0 and calls >= self._max_calls:
            self.refused["too_many_calls"] += 1
            return False
        self._calls[caller.key_id] = calls + 1
        return True

    def bind_call(self, call_id: str, caller: Caller | None) -> None:
        """The claimed call now exists: released when it ends (at once if
        it has ended already: a worker can report a call's end before its
        answer has been relayed)."""
        if caller is None:
            return
        if call_id in self._ended_unbound:
            del self._ended_unbound[call_id]
            self.release_call(caller)
            return
        self._owners[call_id] = caller

    def on_call_change(self, change: str, call_id: str) -> None:
        """A call registry's listener: an ended call frees its key's slot."""
        if change != "ended":
            return
        owner = self._owners.pop(call_id, None)
        if owner is None:  # its maker may not be bound yet: remembered (bounded)
            self._ended_unbound[call_id] = None
            while len(self._ended_unbound) > MAX_ENDED_UNBOUND:
                self._ended_unbound.popitem(last=False)
        self.release_call(owner)

    def release_call(self, caller: Caller | None) -> None:
        if caller is None:
            return
        calls = self._calls.get(caller.key_id, 0) - 1
        if calls > 0:
            self._calls[caller.key_id] = calls
        else:
            self._calls.pop(caller.key_id, None)

    def stats(self) -> dict[str, object]:
        return {
            "required": self.required,
            "keys": len(self._keys),
            "spent_client_secrets": self.secrets.spent_count,
            "calls_by_key": dict(self._calls),
            "refused": dict(self.refused),
        }


def _bearer(header: str) -> str | None:
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def with_bound_session(
    caller: Caller | None, session: dict[str, Any] | None
) -> dict[str, Any] | None:
    """A client secret's session configuration, with the offer's own on top."""
    bound = caller.session if caller is not None else None
    if bound is None:
        return session
    return {**bound, **(session or {})}


AUTH: web.AppKey[Authenticator] = web.AppKey("auth", Authenticator)


@checks_its_own_caller
async def create_client_secret(request: web.Request) -> web.StreamResponse:
    """``POST /v1/realtime/client_secrets`` (OpenAI's shape): with an API
    key, a single-use ``ek_`` secret bound to ``session``."""
    auth = request.app[AUTH]
    try:
        identified = auth.identify(request.headers, allow_secret=False)
    except AuthError as exc:
        return error_response(exc.status, exc.code, str(exc))
    if refused := request_rate_refusal(request, identified.key_id if identified else None):
        return refused
    caller = identified or Caller("local")
    raw = await request.content.read(MAX_SECRET_REQUEST_BYTES + 1)
    if len(raw) > MAX_SECRET_REQUEST_BYTES:
        return error_response(413, "body_too_large", "request body is too large")
    try:
        body = strict_json.loads(raw) if raw.strip() else {}
    except strict_json.JsonRefused:
        return error_response(400, "invalid_json", "the body is not JSON")
    if not isinstance(body, dict):
        return error_response(400, "invalid_body", "the body must be a JSON object")
    session = body.get("session")
    if session is not None and not isinstance(session, dict):
        return error_response(400, "invalid_session", "'session' must be an object")
    expires = body.get("expires_after") or {}
    ttl = expires.get("seconds", DEFAULT_SECRET_TTL_S) if isinstance(expires, dict) else None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        return error_response(400, "invalid_expires_after", "expires_after.seconds: a number")
    try:
        # As given: float() of an integer of hundreds of digits overflows,
        # and the range check refuses it as it is.
        secret = auth.secrets.mint(caller, ttl, session)
    except AuthError as exc:
        return error_response(exc.status, exc.code, str(exc))
    return web.json_response({**secret, "session": session or {}})


def add_client_secrets_route(app: web.Application) -> None:
    app.router.add_post(CLIENT_SECRETS_PATH, create_client_secret)
