"""Checks of an SDP offer that aiortc's parser makes with ``assert``.

Those raise AssertionError (a 500 if uncaught) and are skipped entirely
under ``python -O``, letting a malformed line through to the peer
connection. Checked here first, each refusal names the line.
"""

from __future__ import annotations

import ipaddress
import re

MEDIA_LINE = re.compile(r"^m=([^ ]+) ([0-9]+)(?:/[0-9]+)? ([A-Z/]+) (.+)$")
CONNECTION = re.compile(r"^IN (IP4|IP6) ([^ ]+)$")
# RTCP packet types 72-76 collide with RTP payload types 200-204 (RFC 5761).
FORBIDDEN_PAYLOAD_TYPES = range(72, 77)
BUNDLED_KINDS = ("audio", "video", "application")


class SdpProblem(ValueError):
    pass


def check_offer_lines(sdp: str) -> None:
    """Raise SdpProblem for the first line aiortc would trip over."""
    mids: dict[str, str] = {}  # media section id -> the section's kind
    kind: str | None = None  # of the media section being read
    named = False  # the section being read has its id
    bundles: list[tuple[int, list[str]]] = []
    for number, line in enumerate(sdp.splitlines(), start=1):
        if line.startswith("m="):
            kind, named = _media(line, number), False
        elif line.startswith("c="):
            if not CONNECTION.match(line[2:]):
                raise SdpProblem(f"line {number}: malformed connection line {line[:80]!r}")
        elif line.startswith("a=candidate:"):
            _candidate(line[len("a=candidate:") :], number)
        elif line.startswith("a=mid:") and kind is not None:
            mid = line[len("a=mid:") :].strip()
            if mid in mids or named:  # aiortc would keep the last id of a section
                raise SdpProblem(f"line {number}: a second media id {mid[:20]!r}")
            mids[mid], named = kind, True
        elif line.startswith("a=group:BUNDLE"):
            bundles.append((number, line[len("a=group:BUNDLE") :].split()))
    # aiortc gives every bundled section the first one's transport; when that
    # id names no section it negotiates (audio, video, data), the others get
    # none, and answering and closing fail with AttributeError.
    for number, items in bundles:
        for mid in items:
            if mids.get(mid) not in BUNDLED_KINDS:
                raise SdpProblem(
                    f"line {number}: BUNDLE names {mid[:20]!r}, which is not the id of an "
                    "audio, video or application section"
                )


def _media(line: str, number: int) -> str:
    """Check a media line; its kind."""
    match = MEDIA_LINE.match(line)
    if match is None:
        raise SdpProblem(f"line {number}: malformed media line {line[:80]!r}")
    if match.group(1) in ("audio", "video"):
        for fmt in match.group(4).split():
            if not fmt.isdigit() or int(fmt) > 127 or int(fmt) in FORBIDDEN_PAYLOAD_TYPES:
                raise SdpProblem(f"line {number}: invalid RTP payload type {fmt[:20]!r}")
    return match.group(1)


def _candidate(value: str, number: int) -> None:
    bits = value.split()
    problem = None
    if len(bits) < 8:
        problem = "fewer than 8 fields"
    elif not (bits[1].isdigit() and bits[3].isdigit() and bits[5].isdigit()):
        problem = "component, priority and port must be numbers"
    elif int(bits[5]) > 65535 or bits[6] != "typ":
        problem = "bad port or no 'typ'"
    else:
        try:
            ipaddress.ip_address(bits[4])
        except ValueError:
            if not bits[4].endswith(".local"):  # mDNS candidates from browsers
                problem = "the address is neither an IP address nor an mDNS name"
    if problem is not None:
        raise SdpProblem(f"line {number}: malformed ICE candidate ({problem})")
