"""The JSON error shape every refusal has: ``{"error": {"type", "code", "message"}}``."""

from __future__ import annotations

from aiohttp import web


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {
        "error": {
            "type": "rate_limit_error"
            if status == 429
            else "invalid_request_error"
            if status < 500
            else "server_error",
            "code": code,
            "message": message,
        }
    }
    return web.json_response(body, status=status, headers=headers)


class Refusal(Exception):
    """A refusal raised from deep in reading a request (a bad body), to be
    answered with ``response()`` by whoever reads it."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    def response(self) -> web.Response:
        return error_response(self.status, self.code, str(self))
