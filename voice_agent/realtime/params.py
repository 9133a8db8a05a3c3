"""Checks shared by the client events that carry settings (session.update,
response.create): a parameter this server does not know, or a value it
cannot honour, is refused with an error naming it, never ignored."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from voice_agent.realtime.errors import ClientEventError

JsonDict = dict[str, Any]
PCM_FORMAT: JsonDict = {"type": "audio/pcm", "rate": 24000}


def check_keys(value: JsonDict, known: Collection[str], where: str) -> None:
    for key in value:
        if key not in known:
            raise ClientEventError(
                "unknown_parameter", f"Unknown parameter: '{where}.{key}'.", f"{where}.{key}"
            )


def object_at(value: Any, param: str) -> JsonDict:
    if not isinstance(value, dict):
        raise ClientEventError("invalid_type", f"{param} must be an object", param)
    return value


def unsupported(param: str, why: str) -> ClientEventError:
    return ClientEventError("unsupported_value", f"{param}: {why}", param)


def require_unset(value: Any, param: str, why: str, allowed: Collection[Any] = ()) -> None:
    """A setting this server has no equivalent for: only null (or one of
    ``allowed``, the values that mean what this server does anyway)."""
    if value is None or value in allowed:
        return
    raise unsupported(param, why)


def check_format(value: Any, param: str) -> None:
    """Audio formats: only OpenAI's default, PCM16 at 24 kHz."""
    if value is None:
        return
    fmt = object_at(value, param)
    check_keys(fmt, ("type", "rate"), param)
    if fmt.get("type", "audio/pcm") != "audio/pcm" or fmt.get("rate", 24000) != 24000:
        raise unsupported(param, "only {'type': 'audio/pcm', 'rate': 24000} is supported")


def check_voice(value: Any, param: str, voices: Sequence[str]) -> str:
    """One of the voices the server's TTS has (a name, or ``{"id": name}``
    as OpenAI's custom voices are given): its name."""
    name = value.get("id") if isinstance(value, dict) else value
    if not isinstance(name, str):
        raise ClientEventError("invalid_type", f"{param} must be a voice name", param)
    if name not in voices:
        listed = ", ".join(repr(v) for v in voices)
        raise ClientEventError(
            "invalid_value",
            f"Invalid value: {name!r}. Supported values are: {listed} "
            "(the voices of this server's TTS, listed at GET /v1/voices).",
            param,
        )
    return name


def parse_modalities(value: Any, param: str) -> bool:
    """``["audio"]`` (speech with its transcript) or ``["text"]``: True for audio."""
    if value == ["audio"]:
        return True
    if value == ["text"]:
        return False
    raise ClientEventError("invalid_value", f'{param} must be ["audio"] or ["text"]', param)


def parse_bool(value: Any, param: str) -> bool:
    if not isinstance(value, bool):
        raise ClientEventError("invalid_type", f"{param} must be true or false", param)
    return value


def parse_int(value: Any, param: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ClientEventError(
            "invalid_value", f"{param} must be an integer from {low} to {high}", param
        )
    return value
