"""A WebRTC offer, read and checked: the SDP (and an optional session
configuration) from either body form OpenAI's clients send, refused with
the right status (413, 415, 400) before any peer connection exists, so
bad input leaves nothing behind. The checks here read the text alone;
the process that makes the call parses it as aiortc will
(``server/offer_sdp.py``): in one process before anything is claimed for
it; in front of media workers in the worker, after the front's admission,
whose claims a refusal gives back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.http_exceptions
from aiohttp import BodyPartReader, web

from voice_agent import strict_json
from voice_agent.server.app_keys import SETTINGS
from voice_agent.server.errors import Refusal
from voice_agent.server.sdp_check import check_offer_lines


@dataclass(frozen=True)
class Offer:
    """What a WebRTC offer asks for: its SDP and its session configuration."""

    sdp: str
    session: dict[str, Any] | None


class OfferError(Refusal):
    """An offer refused before any peer connection exists."""


def validate_offer(sdp: str) -> None:
    """Refuse the lines aiortc's parser would trip over."""
    if not sdp.lstrip().startswith("v=0"):
        raise OfferError(400, "invalid_sdp", "body is not an SDP offer (it must start with v=0)")
    try:
        check_offer_lines(sdp)
    except ValueError as exc:  # SdpProblem, or a number the checks could not read
        raise OfferError(400, "invalid_sdp", f"the offer could not be parsed: {exc}") from None


async def read_offer_body(request: web.Request, limit: int) -> tuple[str, dict[str, Any] | None]:
    """The SDP offer (and an optional session config) from either body form."""
    if request.content_length is not None and request.content_length > limit:
        raise OfferError(413, "body_too_large", f"offer larger than {limit} bytes")
    content_type = request.content_type
    if content_type == "application/sdp":
        body = await request.content.read(limit + 1)
        if len(body) > limit:
            raise OfferError(413, "body_too_large", f"offer larger than {limit} bytes")
        session = None
    elif content_type == "multipart/form-data":
        # OpenAI's alternative form: an "sdp" part and an optional "session" part.
        body, session = await _read_multipart(request, limit)
    else:
        raise OfferError(
            415, "unsupported_media_type", "send the SDP offer with Content-Type: application/sdp"
        )
    try:
        sdp = body.decode("utf-8")
    except UnicodeDecodeError:
        raise OfferError(400, "invalid_sdp", "the offer is not UTF-8 text") from None
    validate_offer(sdp)
    return sdp, session


async def _read_multipart(request: web.Request, limit: int) -> tuple[bytes, dict[str, Any] | None]:
    try:
        return await _read_parts(request, limit)
    except (
        ValueError,
        AssertionError,
        EOFError,
        aiohttp.ClientPayloadError,
        aiohttp.http_exceptions.HttpProcessingError,
    ) as exc:
        # No boundary, a broken part header, a body cut short.
        raise OfferError(400, "invalid_body", f"malformed multipart body: {exc}") from None


async def _read_parts(request: web.Request, limit: int) -> tuple[bytes, dict[str, Any] | None]:
    reader = await request.multipart()
    sdp: bytes | None = None
    session: dict[str, Any] | None = None
    total = 0
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):  # nested multipart
            raise OfferError(400, "invalid_body", "nested multipart is not supported")
        data = await part.read()
        total += len(data)
        if total > limit:
            raise OfferError(413, "body_too_large", f"offer larger than {limit} bytes")
        if part.name == "sdp":
            sdp = data
        elif part.name == "session":
            try:
                parsed = strict_json.loads(data)
            except strict_json.JsonRefused as exc:
                raise OfferError(400, "invalid_session", f"'session' is not JSON: {exc}") from None
            if not isinstance(parsed, dict):
                raise OfferError(400, "invalid_session", "'session' must be a JSON object")
            session = parsed
    if sdp is None:
        raise OfferError(400, "invalid_body", "multipart body has no 'sdp' part")
    return sdp, session


async def read_offer(request: web.Request) -> Offer:
    """The request's offer, within the settings' size limit (an
    ``OfferError`` when it is refused)."""
    sdp, session = await read_offer_body(request, request.app[SETTINGS].max_offer_bytes)
    return Offer(sdp, session)
