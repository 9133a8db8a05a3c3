"""The caller's Opus decoded straight to 16 kHz mono (rtc/opus_wideband.py),
against aiortc's own path (FFmpeg at 48 kHz stereo, down-mixed, decimated)
on real speech encoded by libopus."""

from __future__ import annotations

import asyncio
import fractions
import threading

import av
import numpy as np
import pytest
from aiortc import MediaStreamTrack, RTCRtpCodecParameters
from aiortc.codecs.opus import OpusDecoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError
from av import CodecContext

from voice_agent.audio.resample import StreamResampler
from voice_agent.rtc import opus_wideband
from voice_agent.rtc.inbound import frame_to_mono_int16, pump_inbound_audio, stream_position
from voice_agent.rtc.inline_decoding import InlineDecoder
from voice_agent.rtc.opus_wideband import DecodedAudio, OpusDecodeError, WidebandOpusDecoder
from voice_agent.testing.audio_data import librivox

pytestmark = pytest.mark.skipif(not opus_wideband.available(), reason="no libopus")


def encode(samples_48k: np.ndarray, layout: str, frame_samples: int = 960) -> list[bytes]:
    codec = CodecContext.create("libopus", "w")
    assert isinstance(codec, av.audio.codeccontext.AudioCodecContext)
    codec.bit_rate = 32_000
    codec.format = "s16"
    codec.layout = layout
    codec.sample_rate = 48_000
    codec.time_base = fractions.Fraction(1, 48_000)
    codec.options = {"frame_duration": str(frame_samples // 48)}
    channels = 2 if layout == "stereo" else 1
    packets: list[bytes] = []
    for start in range(0, len(samples_48k) - frame_samples + 1, frame_samples):
        chunk = samples_48k[start : start + frame_samples]
        interleaved = np.repeat(chunk, channels) if channels == 2 else chunk
        frame = av.AudioFrame.from_ndarray(interleaved.reshape(1, -1), format="s16", layout=layout)
        frame.sample_rate = 48_000
        frame.pts = start
        packets += [bytes(p) for p in codec.encode(frame)]
    return packets


def speech_48k() -> np.ndarray:
    up = StreamResampler(16_000, 48_000)
    return np.concatenate((up.process(librivox("0930")), up.process(np.zeros(0, np.int16), True)))


def aiortc_path(packets: list[bytes]) -> np.ndarray:
    decoder = OpusDecoder()
    down = StreamResampler(48_000, 16_000, low_latency=True)
    out = [
        down.process(frame_to_mono_int16(frame))  # type: ignore[arg-type]
        for i, p in enumerate(packets)
        for frame in decoder.decode(JitterFrame(p, i * 960))
    ]
    return np.concatenate(out)


def best_correlation(a: np.ndarray, b: np.ndarray, max_lag: int = 64) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    n = min(len(a), len(b)) - max_lag
    scores = []
    for lag in range(max_lag):
        x, y = a[lag : lag + n], b[:n]
        scores.append(float(x @ y / np.sqrt((x @ x) * (y @ y))))
        x, y = a[:n], b[lag : lag + n]
        scores.append(float(x @ y / np.sqrt((x @ x) * (y @ y))))
    return max(scores)


@pytest.mark.parametrize("layout", ["mono", "stereo"])
def test_speech_decodes_to_what_aiortcs_path_gives_in_a_third_of_the_samples(layout: str) -> None:
    packets = encode(speech_48k(), layout)
    decoder = WidebandOpusDecoder()
    decoded = [decoder.decode(p, 960 * i) for i, p in enumerate(packets)]
    assert all(d.samples.shape == (320,) and d.samples.dtype == np.int16 for d in decoded)
    # Stamped like aiortc's frames: the RTP timestamp, on the 48 kHz clock.
    assert [stream_position(d, 0) for d in decoded[:3]] == [0, 320, 640]
    ours = np.concatenate([d.samples for d in decoded])
    theirs = aiortc_path(packets)
    assert abs(len(ours) - len(theirs)) <= 320
    assert best_correlation(ours, theirs) > 0.98
    assert np.abs(ours).max() > 3000  # speech, not silence


def test_a_long_packet_gives_all_its_audio_and_garbage_is_refused_without_harm() -> None:
    packets = encode(speech_48k(), "mono", frame_samples=2880)  # 60 ms packets
    decoder = WidebandOpusDecoder()
    assert decoder.decode(packets[0], 0).samples.shape == (960,)
    with pytest.raises(OpusDecodeError):
        decoder.decode(b"\xff" * 3, 2880)
    assert decoder.decode(packets[1], 2880).samples.shape == (960,)  # it still decodes
    decoder.close()
    with pytest.raises(OpusDecodeError):
        decoder.decode(packets[2], 5760)


def test_a_120_ms_packet_fits_and_two_different_channels_are_mixed() -> None:
    speech = speech_48k()
    stereo = encode(speech, "stereo", frame_samples=5760)  # the longest Opus packet
    decoder = WidebandOpusDecoder()
    assert decoder.decode(stereo[1], 5760).samples.shape == (1920,)
    # Left speech, right silent: the mono decoder mixes them, it does not drop one.
    left_only = encode_channels(speech, np.zeros_like(speech))
    decoder = WidebandOpusDecoder()
    ours = np.concatenate([decoder.decode(p, 0).samples for p in left_only])
    assert best_correlation(ours, speech[::3], max_lag=400) > 0.9  # the codec's delay
    assert 0.25 < np.abs(ours).max() / np.abs(speech).max() < 0.75


def encode_channels(left: np.ndarray, right: np.ndarray) -> list[bytes]:
    codec = CodecContext.create("libopus", "w")
    assert isinstance(codec, av.audio.codeccontext.AudioCodecContext)
    codec.bit_rate = 64_000
    codec.format = "s16"
    codec.layout = "stereo"
    codec.sample_rate = 48_000
    codec.time_base = fractions.Fraction(1, 48_000)
    interleaved = np.stack((left, right), axis=1).reshape(-1)
    packets: list[bytes] = []
    for start in range(0, len(left) - 960 + 1, 960):
        chunk = interleaved[2 * start : 2 * (start + 960)]
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="stereo")
        frame.sample_rate = 48_000
        frame.pts = start
        packets += [bytes(p) for p in codec.encode(frame)]
    return packets


class Receiver:
    """The two things of an aiortc receiver an InlineDecoder uses: its
    track's queue and its decoder-error flag."""

    def __init__(self) -> None:
        self._track = type("Track", (), {"_queue": asyncio.Queue()})()
        self._RTCRtpReceiver__decoder_error = threading.Event()


@pytest.mark.parametrize("opus_16k", [True, False])
async def test_an_empty_payload_is_skipped_and_decoding_goes_on(opus_16k: bool) -> None:
    # aiortc passes a packet of padding only on with an empty payload: libopus
    # would conceal 120 ms for it, FFmpeg would take it for the end of stream.
    packets = encode(speech_48k(), "mono")
    receiver = Receiver()
    inline = InlineDecoder(receiver, opus_16k)
    codec = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000, channels=2)
    for i, payload in enumerate([packets[0], b"", packets[1], packets[2]]):
        inline.put((codec, JitterFrame(payload, 960 * i)))
    inline.put(None)
    queue = receiver._track._queue
    frames = [queue.get_nowait() for _ in range(queue.qsize())]
    assert frames[-1] is None and len(frames) == 4  # three packets of audio, then the end
    sizes = [f.samples.size if isinstance(f, DecodedAudio) else f.samples for f in frames[:-1]]
    assert sizes == ([320] * 3 if opus_16k else [960] * 3)
    assert not receiver._RTCRtpReceiver__decoder_error.is_set()


async def test_the_pump_hands_on_16_khz_audio_as_it_is_and_resamples_the_rest() -> None:
    class QueuedTrack(MediaStreamTrack):
        kind = "audio"

        def __init__(self) -> None:
            super().__init__()
            self.queue: asyncio.Queue[object] = asyncio.Queue()

        async def recv(self) -> object:  # type: ignore[override]
            item = await self.queue.get()
            if item is None:
                raise MediaStreamError
            return item

    track = QueuedTrack()
    tone = (np.sin(np.arange(960) / 48_000 * 2 * np.pi * 440) * 8000).astype(np.int16)
    frame = av.AudioFrame.from_ndarray(np.repeat(tone, 2).reshape(1, -1), "s16", "stereo")
    frame.sample_rate = 48_000
    frame.pts = 960
    frame.time_base = fractions.Fraction(1, 48_000)
    for item in (DecodedAudio(tone[::3].copy(), 0), frame, DecodedAudio(tone[::3].copy(), 1920)):
        track.queue.put_nowait(item)
    track.queue.put_nowait(None)
    heard: list[tuple[int, int]] = []
    await pump_inbound_audio(
        track, lambda samples, position: heard.append((samples.size, position))
    )
    assert [position for _, position in heard] == [0, 320, 640]
    assert heard[0][0] == heard[2][0] == 320  # as it came
    assert 0 < heard[1][0] <= 320  # through the decimator, which holds back its filter's delay
