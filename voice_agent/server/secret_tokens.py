"""Client secrets as stateless tokens: ``ek_<key id>.<sealed>.<mac>``,
where the sealed part is the expiry, a nonce and the bound session (zlib,
base64url) and the mac an HMAC-SHA256 under a key derived from the API
key that minted it. Any replica holding the same API keys accepts them
(replicas share nothing), removing a key revokes its secrets, and minting
stores nothing. Single use is kept here, per process: a spent nonce is
remembered until its secret expires."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import secrets
import time
import zlib
from typing import Any

from voice_agent.server.callers import AuthError, Caller, token_hash

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


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ClientSecrets:
    """Mints, reads and spends client secrets for the given API keys (by
    key id); without keys (auth off, one process) with a key of this
    process's own."""

    def __init__(self, keys: dict[str, str]) -> None:
        self._signing = {
            kid: hmac.new(key.encode(), _SECRET_CONTEXT, hashlib.sha256).digest()
            for kid, key in keys.items()
        }
        self._signing.setdefault("local", secrets.token_bytes(32))
        self._spent: dict[str, float] = {}  # nonce -> its secret's expiry

    @property
    def spent_count(self) -> int:
        return len(self._spent)

    def unseal(self, token: str) -> Caller | None:
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
        return Caller(kid, bound, token_hash(token), nonce, expires_at)

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

    def give_back(self, caller: Caller | None) -> None:
        """The call ``spend`` admitted was not made (refused where it was
        to live, failed, or the client left): its secret is good again
        until it expires, as after a refusal before the spend."""
        if caller is not None and caller.nonce is not None:
            self._spent.pop(caller.nonce, None)

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
