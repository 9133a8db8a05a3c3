"""DTMF digits from RFC 4733 telephone-events on the caller's audio track.

Phones and SIP gateways send key presses as ``telephone-event`` RTP packets
in the audio stream (same SSRC, their own payload type). aiortc knows no
such codec: this module adds it to what aiortc negotiates, so an offer that
carries it gets it in the answer, and takes those packets out of the
receiver before its jitter buffer and decoder (which would choke on them),
handing each key press once to the call's listener.

One key press is many packets (every 50 ms while held, the end three times),
all with the RTP timestamp of the press's start: a digit is reported once,
on the first packet with a new timestamp.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from aiortc import RTCRtpCodecParameters, RTCRtpReceiver
from aiortc.codecs import CODECS
from aiortc.rtp import RtpPacket

from voice_agent.rtc import internals
from voice_agent.rtc.dtmf_events import EVENTS

log = logging.getLogger(__name__)

MIME_TYPE = "audio/telephone-event"
# The payload type most phones use; an offer's own number wins in the answer.
PAYLOAD_TYPE = 101

DigitListener = Callable[[str], None]
# A key press's two reports (an RTP event and a SIP INFO) arrive within this
# of each other; two presses of one key are at least ~100 ms apart each way.
SAME_PRESS_S = 1.0
# The receiver's own attribute, not a table keyed by receiver: the listener
# (a call's method) holds the call, which holds the receiver; in a weak-keyed
# table that would keep every call alive forever.
LISTENER_ATTRIBUTE = "_voice_agent_digits"


def is_telephone_event(codec: RTCRtpCodecParameters) -> bool:
    return codec.mimeType.lower() == MIME_TYPE


class _Digits:
    def __init__(self, listener: DigitListener) -> None:
        self._listener = listener
        self._last_timestamp: int | None = None

    def packet(self, packet: RtpPacket) -> None:
        payload = packet.payload
        if len(payload) < 4 or payload[0] >= len(EVENTS):
            return  # not a key press (flash, tones of RFC 4734)
        if packet.timestamp == self._last_timestamp:
            return  # the same press, still held or ending
        self._last_timestamp = packet.timestamp
        self._listener(EVENTS[payload[0]])


class KeyPresses:
    """Each key press once, from whichever way it came. A phone or PBX may
    send a press both as an RFC 4733 event in the audio and as a SIP INFO;
    a press from one way is matched (and dropped) by the same key from the
    other way within ``SAME_PRESS_S``, each report matching at most one, so
    "55" sent both ways is still two presses, and presses sent only one way
    are never merged."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._unmatched: deque[tuple[str, str, float]] = deque()  # key, way, when

    def accept(self, key: str, way: str) -> bool:
        """Whether ``key`` from ``way`` ("rtp", "sip-info") is a new press."""
        now = self._clock()
        while self._unmatched and now - self._unmatched[0][2] > SAME_PRESS_S:
            self._unmatched.popleft()
        for index, (seen, seen_way, _) in enumerate(self._unmatched):
            if seen == key and seen_way != way:
                del self._unmatched[index]
                return False
        self._unmatched.append((key, way, now))
        return True


def listen(receiver: RTCRtpReceiver, listener: DigitListener) -> None:
    """Report the key presses arriving on ``receiver`` to ``listener``."""
    setattr(receiver, LISTENER_ATTRIBUTE, _Digits(listener))


def install() -> None:
    """Negotiate telephone-event/8000 and route its packets to the listeners
    (process-wide, like aiortc's own codec table)."""
    audio = CODECS["audio"]
    if not any(is_telephone_event(codec) for codec in audio):
        # Last: never the codec the answer sends audio in.
        audio.append(
            RTCRtpCodecParameters(
                mimeType=MIME_TYPE,
                clockRate=8000,
                channels=1,
                payloadType=PAYLOAD_TYPE,
                parameters={"0-15": None},
            )
        )
    handle = RTCRtpReceiver._handle_rtp_packet
    if getattr(handle, "_dtmf_aware", False) or not internals.patchable("DTMF receive"):
        return

    async def handle_rtp_packet(
        self: RTCRtpReceiver, packet: RtpPacket, arrival_time_ms: int
    ) -> None:
        codecs: dict[int, RTCRtpCodecParameters] = getattr(self, "_RTCRtpReceiver__codecs", {})
        codec = codecs.get(packet.payload_type)
        if codec is not None and is_telephone_event(codec):
            digits = getattr(self, LISTENER_ATTRIBUTE, None)
            if digits is not None:
                digits.packet(packet)
            return
        await handle(self, packet, arrival_time_ms=arrival_time_ms)

    marked: Any = handle_rtp_packet
    marked._dtmf_aware = True
    RTCRtpReceiver._handle_rtp_packet = marked  # type: ignore[method-assign]
