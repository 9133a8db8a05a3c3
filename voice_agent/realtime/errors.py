"""Realtime ``error`` events: the one shape every refusal of a client event
takes (OpenAI's: ``type``, ``code``, ``message``, ``param``, and the
client's ``event_id`` it answers), and the exception a handler raises
for a bad client event, which the protocol turns into one."""

from __future__ import annotations

from typing import Any


class ClientEventError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


def error_event(
    error_type: str,
    code: str,
    message: str,
    param: str | None = None,
    event_id: str | None = None,
) -> dict[str, Any]:
    """An ``error`` event (without its own ``event_id``, which sending adds)."""
    return {
        "type": "error",
        "error": {
            "type": error_type,
            "code": code,
            "message": message,
            "param": param,
            "event_id": event_id,
        },
    }
