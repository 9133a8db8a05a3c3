"""The caller's audio handed on as it arrives, not held for playout.

aiortc gives every audio receiver a jitter buffer that passes a packet to
the decoder only once four newer ones have arrived: 80 ms of cushion, which
a player needs to play smoothly through network jitter. This server does
not play the caller's audio, it listens to it (VAD, STT, the echo
canceller's near end), and every one of those works on the packets'
stream positions (RTP timestamps), not on when they are handled. So the
cushion is pure delay: the end of the caller's speech reached the VAD
80 ms after it arrived, and so did every reply.

Here each packet newer than the last one passed on goes to the decoder at
once. A packet older than that (reordered, or a duplicate) is dropped and
its 20 ms are lost, as if it had been; a lost packet costs nothing but its
own 20 ms (aiortc's buffer stalls on a gap until 16 packets are queued).

Installed per receiver over aiortc's stock buffer only (``use_for``); an
aiortc whose receiver no longer has one keeps its own, and says so.
"""

from __future__ import annotations

import logging

from aiortc import RTCRtpReceiver
from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket

from voice_agent.rtc import internals

log = logging.getLogger(__name__)

ATTRIBUTE = "_RTCRtpReceiver__jitter_buffer"  # the receiver's own (name-mangled)
# A sequence number this far behind the last one passed on is a restarted
# stream (a new sender, a SIP re-INVITE to another phone), not a late packet
# (aiortc's own buffer draws the line at 100 too).
RESTART_GAP = 100


class ArrivalOrderBuffer:
    """The jitter buffer's interface (``add``), releasing audio at once."""

    def __init__(self) -> None:
        self._last: int | None = None  # sequence number of the last packet passed on
        self._ssrc: int | None = None  # whose sequence numbers those are
        self.dropped = 0  # late, reordered or duplicated packets

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        """(PLI wanted: never, for audio; the frame to decode now, or None)."""
        sequence = packet.sequence_number
        if packet.ssrc != self._ssrc:  # another source: its own numbering from here
            self._ssrc, self._last = packet.ssrc, None
        if self._last is not None:
            ahead = (sequence - self._last) % 65536
            if ahead == 0 or 65536 - ahead < RESTART_GAP:
                self.dropped += 1
                return False, None
        self._last = sequence
        data: bytes = getattr(packet, "_data", b"")  # the receiver depayloads before add()
        return False, JitterFrame(data=data, timestamp=packet.timestamp)


def use_for(receiver: RTCRtpReceiver) -> bool:
    """Give an audio receiver the arrival-order buffer; False (logged) when
    the receiver is not the one this was written against."""
    current = getattr(receiver, ATTRIBUTE, None)
    if isinstance(current, ArrivalOrderBuffer):
        return True
    if not internals.patchable("arrival-order jitter buffer"):
        return False
    if not isinstance(current, JitterBuffer) or current.capacity != 16:
        log.warning("aiortc's audio receiver changed: keeping its own jitter buffer")
        return False
    setattr(receiver, ATTRIBUTE, ArrivalOrderBuffer())
    return True
