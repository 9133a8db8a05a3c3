"""The error a bad client event raises; the protocol turns it into an ``error`` event."""

from __future__ import annotations


class ClientEventError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
