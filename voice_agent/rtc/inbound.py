"""Read the caller's audio track and feed the session 16 kHz mono PCM.

aiortc decodes Opus to 48 kHz interleaved stereo s16 frames, G.711 to 8 kHz
mono. Each frame is down-mixed and run through this session's stateful
resampler. With ``--input-opus-16k``, Opus decoded on the event loop
(``inline_decoding``) arrives as 16 kHz mono already (``opus_wideband.DecodedAudio``)
and is handed on as it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from voice_agent.audio.pcm import downmix_interleaved, float_to_int16
from voice_agent.audio.resample import StreamResampler
from voice_agent.rtc.opus_wideband import DecodedAudio

log = logging.getLogger(__name__)

STT_RATE = 16_000


def frame_to_mono_int16(frame: av.AudioFrame) -> np.ndarray:
    """Mono int16 samples from a decoded frame (aiortc's Opus decoder gives
    packed s16; planar and float layouts are handled for other decoders)."""
    channels = len(frame.layout.channels)
    samples = frame.to_ndarray()
    if samples.dtype != np.int16:
        samples = float_to_int16(samples.astype(np.float32))
    if frame.format.is_planar:
        return downmix_interleaved(samples.T.reshape(-1), channels)
    return downmix_interleaved(samples.reshape(-1), channels)


def stream_position(frame: av.AudioFrame | DecodedAudio, counted: int) -> int:
    """A decoded frame's timestamp at 16 kHz (aiortc stamps frames with
    their RTP timestamp, in samples of the codec's clock); a decoder that
    stamps none gets ``counted``, the samples handed on so far."""
    if frame.pts is None:
        return counted
    if frame.time_base is not None:  # the RTP clock, which need not be the sample rate
        return int(frame.pts * frame.time_base * STT_RATE)
    return int(frame.pts * STT_RATE // frame.sample_rate)


class InboundAudioStopped(Exception):
    """The peer's audio stopped arriving, the track still open."""


async def pump_inbound_audio(
    track: MediaStreamTrack,
    sink: Callable[[np.ndarray, int], None],
    max_gap_s: float | None = None,
    gap_allowed: Callable[[], bool] = lambda: False,
) -> None:
    """Until the track ends: decode, down-mix, resample, hand to ``sink``
    with the audio's stream position (its RTP timestamp, in 16 kHz samples).

    A peer that vanishes (its process killed, its network gone) sends no
    goodbye, and ICE consent only notices after about 30 s; but a live peer
    sends a packet every 20 ms, silence included. So once audio has flowed,
    ``max_gap_s`` without a frame raises InboundAudioStopped, unless
    ``gap_allowed()`` says the silence is expected (a call on hold, whose
    phone may send nothing)."""
    resampler: StreamResampler | None = None
    flowing = False
    counted = 0
    while True:
        try:
            if flowing and max_gap_s is not None:
                async with asyncio.timeout(max_gap_s):
                    frame = await track.recv()
            else:
                frame = await track.recv()
        except MediaStreamError:
            return
        except TimeoutError:
            if gap_allowed():
                continue  # recv is cancel-safe: no frame was taken
            raise InboundAudioStopped(f"no audio from the peer for {max_gap_s:g} s") from None
        flowing = True
        if isinstance(frame, DecodedAudio):  # decoded to mono, maybe at 16 kHz already
            mono = frame.samples
        else:
            assert isinstance(frame, av.AudioFrame)
            mono = frame_to_mono_int16(frame)
        if frame.sample_rate == STT_RATE:
            samples = mono
        else:
            if resampler is None or resampler.in_rate != frame.sample_rate:
                resampler = StreamResampler(frame.sample_rate, STT_RATE, low_latency=True)
            samples = resampler.process(mono)
        position = stream_position(frame, counted)
        counted = position + len(samples)
        sink(samples, position)
