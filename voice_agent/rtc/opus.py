"""Opus encoding for the outbound track, done by the track itself.

aiortc encodes every frame a track returns: it hops to a worker thread,
up-mixes to stereo, encodes at 96 kb/s and measures the audio level, fifty
times a second per call, even for silence. A track that returns ready Opus
packets skips all of that. Silence, which is most of a call, is one packet
encoded once per process and re-sent with a new timestamp.
"""

from __future__ import annotations

import fractions
import re
from functools import cache
from typing import Any

import av
import numpy as np
from av import CodecContext
from av.audio.codeccontext import AudioCodecContext

SAMPLE_RATE = 48_000
FRAME_SAMPLES = 960
TIME_BASE = fractions.Fraction(1, SAMPLE_RATE)
BITRATE = 32_000  # mono speech: transparent well below aiortc's 96 kb/s stereo


def _encoder(fec_loss_percent: int = 0) -> AudioCodecContext:
    """``fec_loss_percent``: code in-band FEC (each packet carries a coarse
    copy of the frame before it) for that expected packet loss; 0: none."""
    codec = CodecContext.create("libopus", "w")
    assert isinstance(codec, AudioCodecContext)
    codec.bit_rate = BITRATE
    codec.format = "s16"
    codec.layout = "mono"
    codec.sample_rate = SAMPLE_RATE
    codec.time_base = TIME_BASE
    codec.options = {"application": "voip"}
    if fec_loss_percent > 0:
        codec.options = {**codec.options, "fec": "1", "packet_loss": str(fec_loss_percent)}
    return codec


def _frame(samples: np.ndarray) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = SAMPLE_RATE
    frame.time_base = TIME_BASE
    return frame


@cache
def silence_payload() -> bytes:
    """A 20 ms Opus packet of digital silence (encoded once per process)."""
    codec = _encoder()
    payload = b""
    for index in range(10):  # past the encoder's start-up, silence packets are tiny
        frame = _frame(np.zeros(FRAME_SAMPLES, dtype=np.int16))
        frame.pts = index * FRAME_SAMPLES
        for packet in codec.encode(frame):
            payload = bytes(packet)
    return payload


def make_packet(payload: bytes, pts: int) -> av.Packet[Any]:
    packet = av.Packet(payload)
    packet.pts = pts
    packet.time_base = TIME_BASE
    return packet


class OpusStream:
    """Encodes one outbound stream's 20 ms mono frames into Opus packets
    (with in-band FEC for ``fec_loss_percent`` of packets lost, when not 0)."""

    def __init__(self, fec_loss_percent: int = 0) -> None:
        self._codec = _encoder(fec_loss_percent)
        self._index = 0

    def encode(self, samples: np.ndarray) -> bytes:
        frame = _frame(samples)
        frame.pts = self._index * FRAME_SAMPLES
        self._index += 1
        payloads = [bytes(packet) for packet in self._codec.encode(frame)]
        # libopus returns exactly one packet per 20 ms frame; should it ever
        # hold one back, silence keeps the stream's timing intact.
        return payloads[0] if payloads else silence_payload()


def opus_fec_asked(answer: str) -> bool:
    """Whether an answer's first audio codec is Opus and asks for in-band FEC."""
    lines = answer.splitlines()
    audio = next((line for line in lines if line.startswith("m=audio ")), None)
    if audio is None or len(audio.split()) < 4:
        return False
    first = re.escape(audio.split()[3])  # the payload type the answerer prefers
    opus = any(re.match(rf"a=rtpmap:{first} opus/", line, re.IGNORECASE) for line in lines)
    fmtp = next((line for line in lines if re.match(rf"a=fmtp:{first} ", line)), "")
    return opus and "useinbandfec=1" in fmtp.replace(" ", "").lower()
