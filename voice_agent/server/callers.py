"""Who a request is from (``Caller``), and the errors authentication
raises: the small vocabulary the authenticator, client secrets and
admission share."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any


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


def key_id(key: str) -> str:
    return "key_" + hashlib.sha256(key.encode()).hexdigest()[:12]


def token_bytes(token: str) -> bytes:
    # aiohttp decodes header bytes that are not UTF-8 as surrogates.
    return token.encode("utf-8", "surrogateescape")


def token_hash(token: str) -> str:
    return hashlib.sha256(token_bytes(token)).hexdigest()
