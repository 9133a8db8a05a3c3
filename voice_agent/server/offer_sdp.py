"""An offer's SDP as aiortc reads it: refused (400) where a peer connection
could not be made from it, before the process that checks it claims
anything for the call.

Apart from ``server/offers.py`` because it loads aiortc: only a process
that makes calls itself checks this (one process, or a media worker);
the front of media workers forwards the offer and relays the worker's
refusal.
"""

from __future__ import annotations

from aiortc.sdp import SessionDescription

from voice_agent.server.offers import OfferError


def check_parsed_offer(sdp: str) -> None:
    """Refuse what a peer connection would refuse: text aiortc cannot
    parse, or no audio section with ICE credentials and a DTLS fingerprint."""
    try:
        parsed = SessionDescription.parse(sdp)
    except Exception as exc:  # parsing the client's text: whatever fails, the text is bad
        raise OfferError(400, "invalid_sdp", f"the offer could not be parsed: {exc}") from None
    audio = [media for media in parsed.media if media.kind == "audio"]
    if not audio:
        raise OfferError(400, "no_audio", "the offer has no audio media section")
    for media in audio:
        if media.ice is None or not media.ice.usernameFragment or not media.ice.password:
            raise OfferError(400, "invalid_sdp", "the audio section has no ICE credentials")
        if media.dtls is None or not media.dtls.fingerprints:
            raise OfferError(400, "invalid_sdp", "the audio section has no DTLS fingerprint")
