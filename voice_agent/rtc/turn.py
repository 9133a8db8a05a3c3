"""Short-lived TURN credentials: the TURN REST API scheme coturn implements
(``use-auth-secret`` with ``static-auth-secret``).

The server and the TURN server share one secret and never talk: a username
is ``<expiry unix time>:<name>`` and its password is
``base64(HMAC-SHA1(secret, username))``, so anyone who knows the secret can
mint credentials, and the TURN server checks them, and their expiry, by
computing the same HMAC. A leaked credential is good only until its expiry.

coturn checks the expiry on every authenticated request (allocation,
refresh, permissions), so a credential must outlast the call it carries:
the settings refuse a ``--turn-ttl-s`` shorter than ``--max-call-duration-s``.

Without aiortc: the front of media workers hands clients their
credentials (``/v1/ice-servers``) and never loads the media stack; the
peer connection's own ICE servers are ``rtc/call.py``'s.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import re
import secrets
import time
from dataclasses import dataclass

from voice_agent.config import Settings

# What coturn keeps of a name after the expiry and its ':' separator.
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9_.@-]")
MAX_NAME_CHARS = 64
# The TURN users a caller's credentials are spread over. coturn's quota is
# per user (user-quota, 12 in the shipped config): one user for all of a
# key's credentials let one caller lock the key's others out; one user per
# credential let one key take the whole server (total-quota, 100) with nine
# requests. Four: a key holds at most 48 allocations, and its callers share
# four quotas.
TURN_USERS_PER_NAME = 4


@dataclass(frozen=True)
class TurnCredential:
    username: str
    credential: str
    expires_at: int


def mint(
    secret: str, name: str, ttl_s: float, now: float | None = None, lane: str | None = None
) -> TurnCredential:
    """A credential for ``name`` that expires ``ttl_s`` from ``now``.

    coturn counts its per-user quota on what follows the expiry: the name
    and ``lane``, one of a few (client_ice_servers), or one of its own when
    None (the server's own credential of each call)."""
    expires_at = math.floor((time.time() if now is None else now) + ttl_s)
    safe_name = _UNSAFE_NAME.sub("_", name)[:MAX_NAME_CHARS] or "anonymous"
    username = f"{expires_at}:{safe_name}.{secrets.token_hex(4) if lane is None else lane}"
    digest = hmac.new(secret.encode(), username.encode(), hashlib.sha1).digest()
    return TurnCredential(username, base64.b64encode(digest).decode("ascii"), expires_at)


def client_ice_servers(settings: Settings, name: str) -> tuple[list[dict[str, object]], int | None]:
    """What a client should put in its RTCConfiguration.iceServers: the STUN
    servers of ``--ice-servers`` and the TURN servers of ``--turn-urls`` with
    freshly minted credentials; and when those expire (None without TURN).
    The server's own static TURN credentials (``--ice-credential``) are
    never handed out."""
    servers: list[dict[str, object]] = []
    stun = [url for url in settings.ice_servers if url.startswith(("stun:", "stuns:"))]
    if stun:
        servers.append({"urls": stun})
    if settings.turn_secret is None or not settings.turn_urls:
        return servers, None
    lane = str(secrets.randbelow(TURN_USERS_PER_NAME))
    minted = mint(settings.turn_secret, name, settings.turn_ttl_s, lane=lane)
    turn = {"urls": list(settings.turn_urls), "username": minted.username}
    servers.append({**turn, "credential": minted.credential})
    return servers, minted.expires_at
