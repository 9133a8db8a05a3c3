"""G.711 (PCMU, PCMA) encoding for the outbound track, done by the track.

Telephone gateways offer G.711 at 8 kHz; answering in it means no
transcoding in the gateway. The track's 48 kHz frames go through a stateful
6:1 decimator (one per stream, so no clicks at frame edges) and a lookup
table built once from FFmpeg's own G.711 encoder: one numpy index per frame.
"""

from __future__ import annotations

from functools import cache
from typing import Literal, Protocol

import av
import numpy as np
from av import CodecContext

from voice_agent.audio.resample import StreamResampler
from voice_agent.rtc.opus import OpusStream, silence_payload

G711_RATE = 8_000
G711_CODECS = {"PCMU": "pcm_mulaw", "PCMA": "pcm_alaw"}
G711Name = Literal["PCMU", "PCMA"]


class FrameEncoder(Protocol):
    """Turns 20 ms of mono int16 48 kHz audio into one RTP payload."""

    def encode(self, samples: np.ndarray) -> bytes: ...

    def silence(self) -> bytes: ...


@cache
def _table(name: G711Name) -> np.ndarray:
    """The G.711 byte of every int16 value, from FFmpeg's encoder."""
    codec = CodecContext.create(G711_CODECS[name], "w")
    assert isinstance(codec, av.audio.codeccontext.AudioCodecContext)
    codec.format = "s16"
    codec.layout = "mono"
    codec.sample_rate = G711_RATE
    every_value = np.arange(-32768, 32768, dtype=np.int16)
    frame = av.AudioFrame.from_ndarray(every_value.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = G711_RATE
    frame.pts = 0
    encoded = b"".join(bytes(packet) for packet in codec.encode(frame))
    table = np.frombuffer(encoded, dtype=np.uint8)
    assert len(table) == 65536
    return table


class G711Stream:
    """Encodes one outbound stream's 20 ms 48 kHz frames as 8 kHz G.711."""

    def __init__(self, name: G711Name) -> None:
        self._table = _table(name)
        self._resampler = StreamResampler(48_000, G711_RATE)
        self._silence = bytes(self._table[[32768] * (G711_RATE // 50)])

    def encode(self, samples: np.ndarray) -> bytes:
        narrow = self._resampler.process(samples)
        return bytes(self._table[narrow.astype(np.int32) + 32768])

    def silence(self) -> bytes:
        return self._silence


class OpusFrames:
    """The Opus encoder behind the same interface."""

    def __init__(self, fec_loss_percent: int = 0) -> None:
        self._opus = OpusStream(fec_loss_percent)

    def encode(self, samples: np.ndarray) -> bytes:
        return self._opus.encode(samples)

    def silence(self) -> bytes:
        return silence_payload()


def encoder_for(mime_type: str, fec_loss_percent: int = 0) -> FrameEncoder:
    """The encoder for a negotiated codec ("audio/opus", "audio/PCMU", ...);
    Opus with in-band FEC for ``fec_loss_percent`` of packets lost."""
    name = mime_type.split("/", 1)[-1].upper()
    if name == "PCMU":
        return G711Stream("PCMU")
    if name == "PCMA":
        return G711Stream("PCMA")
    if name == "OPUS":
        return OpusFrames(fec_loss_percent)
    raise ValueError(f"no encoder for {mime_type}")
