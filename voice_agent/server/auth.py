"""Who may call: API keys, short-lived client secrets, and per-key limits.

As OpenAI's API: a server holds an API key (``Authorization: Bearer KEY``);
a browser app's backend mints a client secret with it
(``POST /v1/realtime/client_secrets``) and hands the page that ``ek_...``
value, which the page uses for its call. A secret is bound to the session
configuration it was minted with, expires (``expires_after.seconds``, 10
minutes by default, at most 2 hours), and is good for one call: used or
expired, it is refused.

A client secret is stateless: its key's id, expiry, a nonce and the bound
session, signed with a key derived from the API key that minted it. Any
replica that holds the same API keys accepts it (replicas behind a
balancer share nothing), removing the key revokes its secrets, and
minting keeps nothing. Single use is enforced per process: a spent
secret's nonce is kept until it expires, and it is spent only once its
call has a slot (a 503 leaves it good for the retry). Across N replicas a
secret could be used once on each within its lifetime; keep it short.

Authentication is required when keys are configured or the server listens
beyond loopback (``--auth auto``), and off only on loopback with no keys;
``--auth required`` or ``off`` say so explicitly. Keys are at least
``MIN_SECRET_CHARS`` long and never a documented placeholder. Limits per key
(offers a minute, calls at once) sit beside the per-address ones; a secret
counts against the key that minted it. A call is managed (``GET``,
``DELETE``) by the key that made it or with the secret it was made with.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ipaddress
import json
import logging
import math
import secrets
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from voice_agent.config import Settings, weak_secret
from voice_agent.ratelimit import TokenBucket
from voice_agent.server.errors import error_response
from voice_agent.server.limits import request_rate_refusal
from voice_agent.server.route_marks import checks_its_own_caller

log = logging.getLogger(__name__)

SECRET_PREFIX = "ek_"
DEFAULT_SECRET_TTL_S = 600
MAX_SECRET_TTL_S = 7200
MIN_SECRET_TTL_S = 1  # OpenAI's least is 10 s; shorter harms no one
# Spent secrets remembered (until they expire) for single use; beyond it
# the oldest are forgotten first. ~100 bytes each.
MAX_SPENT_SECRETS = 100_000
# A secret travels in an Authorization header or a WebSocket subprotocol,
# which servers cap at ~8 KiB: the bound session must fit, compressed.
MAX_SECRET_CHARS = 6000
_SECRET_CONTEXT = b"voice-agent client secret v1"


CLIENT_SECRETS_PATH = "/v1/realtime/client_secrets"
MAX_SECRET_REQUEST_BYTES = 64 * 1024


class AuthConfigError(RuntimeError):
    """Authentication is required but cannot work as configured."""


class AuthError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


@dataclass(frozen=True)
class Caller:
    """Whom a request is from: ``key_id`` names the API key (a short hash,
    never the key), ``session`` is a client secret's bound configuration."""

    key_id: str
    session: dict[str, Any] | None = None
    secret_hash: str | None = None  # the client secret it came with (sha256)
    # A client secret's nonce and expiry: spent (once) when its call is admitted.
    nonce: str | None = None
    expires_at: float = 0.0


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def key_id(key: str) -> str:
    return "key_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def _token_bytes(token: str) -> bytes:
    # aiohttp decodes header bytes that are not UTF-8 as surrogates.
    return token.encode("utf-8", "surrogateescape")


def _hash(token: str) -> str:
    return hashlib.sha256(_token_bytes(token)).hexdigest()


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
        # Secrets are signed per key; without keys (auth off, one process)
        # with a key of this process's own.
        self._signing = {
            kid: hmac.new(key.encode(), _SECRET_CONTEXT, hashlib.sha256).digest()
            for kid, key in self._keys.items()
        }
        self._signing.setdefault("local", secrets.token_bytes(32))
        self._spent: dict[str, float] = {}  # nonce -> its secret's expiry
        self._offers_per_minute = offers_per_minute_per_key
        self._max_calls = max_calls_per_key
        self._buckets: dict[str, TokenBucket] = {}
        self._calls: dict[str, int] = {}
        self._owners: dict[str, Caller] = {}  # live call id -> its caller
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
                return self._unseal(token)
            return None
        if token is None:
            self.refused["unauthorized"] += 1
            raise AuthError(401, "missing_api_key", "send an API key: Authorization: Bearer KEY")
        kid = self._key_of(token)
        if kid is not None:
            return Caller(kid)
        if allow_secret and token.startswith(SECRET_PREFIX):
            caller = self._unseal(token)
            if caller is not None:
                return caller
            self.refused["unauthorized"] += 1
            raise AuthError(401, "invalid_client_secret", "the client secret is expired or used")
        self.refused["unauthorized"] += 1
        raise AuthError(401, "invalid_api_key", "the API key is not valid")

    def _key_of(self, token: str) -> str | None:
        """The id of the API key ``token`` is, compared in constant time
        (as bytes: a token with characters beyond ASCII is just wrong)."""
        given = _token_bytes(token)
        found = None
        for kid, key in self._keys.items():
            if hmac.compare_digest(given, key.encode()):
                found = kid
        return found

    def _unseal(self, token: str) -> Caller | None:
        """The caller a client secret stands for, if it is one this
        service's keys signed, unexpired and not spent here; else None.
        The signature is checked before anything in it is decoded."""
        if len(token) > MAX_SECRET_CHARS:
            return None
        kid, _, rest = token[len(SECRET_PREFIX) :].partition(".")
        sealed, _, mac = rest.partition(".")
        signing = self._signing.get(kid)
        if signing is None:
            return None
        signed = f"{kid}.{sealed}".encode("ascii", "replace")
        expected = hmac.new(signing, signed, hashlib.sha256).digest()
        try:
            # Canonical only: base64's unused low bits would let another
            # string stand for the same signature.
            if not hmac.compare_digest(_unb64(mac), expected) or _b64(expected) != mac:
                return None
            payload = json.loads(zlib.decompress(_unb64(sealed)))
        except (binascii.Error, ValueError, zlib.error, RecursionError):
            return None
        if not isinstance(payload, dict):
            return None
        nonce, expires_at, session = payload.get("n"), payload.get("e"), payload.get("s")
        if not isinstance(nonce, str) or not isinstance(expires_at, int):
            return None
        if expires_at <= time.time() or nonce in self._spent:
            return None
        bound = session if isinstance(session, dict) else None
        return Caller(kid, bound, _hash(token), nonce, expires_at)

    def spend(self, caller: Caller | None) -> bool:
        """Spend the client secret the caller came with, as its call is
        admitted: False if it was spent meanwhile (the same secret twice at
        once). Callers with an API key have nothing to spend."""
        if caller is None or caller.nonce is None:
            return True
        now = time.time()
        if caller.nonce in self._spent or caller.expires_at <= now:
            return False
        if len(self._spent) >= MAX_SPENT_SECRETS:
            for nonce in [n for n, expiry in self._spent.items() if expiry <= now]:
                del self._spent[nonce]
            while len(self._spent) >= MAX_SPENT_SECRETS:
                del self._spent[next(iter(self._spent))]  # the oldest first
        self._spent[caller.nonce] = caller.expires_at
        return True

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
            if made_with is not None and hmac.compare_digest(made_with, _hash(token)):
                return
            if owner is None and token.startswith(SECRET_PREFIX):
                # Its call may have ended already (the page's hang-up comes late).
                raise AuthError(404, "call_not_found", "no such call")
            self.refused["unauthorized"] += 1
            raise AuthError(401, "invalid_api_key", "the API key is not valid")
        if owner is not None and owner.key_id != kid:
            raise AuthError(404, "call_not_found", "no such call")

    # -- client secrets ---------------------------------------------------------
    def mint(self, caller: Caller, ttl_s: float, session: dict[str, Any] | None) -> dict[str, Any]:
        """A new single-use secret, bound to ``session``, signed for the
        caller's key."""
        if not MIN_SECRET_TTL_S <= ttl_s <= MAX_SECRET_TTL_S:
            raise AuthError(
                400,
                "invalid_expires_after",
                f"expires_after.seconds must be {MIN_SECRET_TTL_S}-{MAX_SECRET_TTL_S}",
            )
        expires_at = math.floor(time.time() + ttl_s)
        payload: dict[str, Any] = {"e": expires_at, "n": secrets.token_urlsafe(12)}
        if session is not None:
            payload["s"] = session
        text = json.dumps(payload, separators=(",", ":")).encode()
        # The key's id in the clear: it says which signing key to check with.
        signed = f"{caller.key_id}.{_b64(zlib.compress(text, 9))}"
        mac = hmac.new(self._signing[caller.key_id], signed.encode("ascii"), hashlib.sha256)
        value = f"{SECRET_PREFIX}{signed}.{_b64(mac.digest())}"
        if len(value) > MAX_SECRET_CHARS:
            raise AuthError(
                400,
                "session_too_large",
                f"the session bound to a client secret must fit in {MAX_SECRET_CHARS} "
                f"characters once compressed (this one takes {len(value)}); set the rest "
                "with session.update once the call is up",
            )
        return {"value": value, "expires_at": expires_at}

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
        """The claimed call now exists: released when it ends."""
        if caller is not None:
            self._owners[call_id] = caller

    def on_call_change(self, change: str, call_id: str) -> None:
        """A call registry's listener: an ended call frees its key's slot."""
        if change == "ended":
            self.release_call(self._owners.pop(call_id, None))

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
            "spent_client_secrets": len(self._spent),
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
        body = json.loads(raw) if raw.strip() else {}
    except (ValueError, RecursionError):
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
        secret = auth.mint(caller, float(ttl), session)
    except AuthError as exc:
        return error_response(exc.status, exc.code, str(exc))
    return web.json_response({**secret, "session": session or {}})


def add_client_secrets_route(app: web.Application) -> None:
    app.router.add_post(CLIENT_SECRETS_PATH, create_client_secret)
