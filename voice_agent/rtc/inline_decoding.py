"""A cheaper hand-off of decoded audio from aiortc's decoder thread.

aiortc decodes each received RTP frame in a per-track thread and hands the
frame back to the event loop with ``asyncio.run_coroutine_threadsafe(
queue.put(frame))``: a coroutine, a Task and a concurrent Future for every
20 ms of every caller's audio. Profiled on idle calls, that hand-off was
about a fifth of a call's whole CPU, more than the Opus decoding itself. The
track's queue is unbounded, so ``put_nowait`` scheduled with
``call_soon_threadsafe`` does the same thing with one callback.

The replacement is installed only over the exact function it was written
against (aiortc's ``decoder_worker`` with these parameters); another aiortc
keeps its own, and says so in the log.

``decode_inline(receiver)`` goes further for an audio receiver: no thread
at all. A 20 ms Opus or G.711 frame decodes in tens of microseconds, less
than the hop costs (profiled on 5 idle calls: the self-pipe write that wakes
the loop for every frame cost as much as the Opus decoding, before the
thread's queue and GIL hand-offs), so the packet is decoded on the event
loop, where it arrived, and the frame goes straight into the track's queue.
The receiver still starts its thread; given an inline decoder, the thread
returns at once. With ``opus_16k`` (``--input-opus-16k``) Opus is decoded
there straight to the 16 kHz mono the session listens to (``opus_wideband``).

Decoded there, a lost packet can be filled in too (the arrival-order
buffer passes a gap on at once, and a late packet is a lost one), rather
than the audio on both sides of it spliced together, every word with a
hole cut out of it. G.711 is concealed by repeating the caller's
last pitch periods (``audio.concealment``, ITU-T G.711 Appendix I), cross-faded
into the next packet's first period repeated backwards; Opus
by libopus, from the FEC the next packet carries, which a browser sends
only when the answer asks for it (``ask_for_fec``).
"""

from __future__ import annotations

import asyncio
import fractions
import inspect
import logging
import queue
import threading
from typing import Any

import aiortc.rtcrtpreceiver as receiver_module
import av
import numpy as np
from aiortc.codecs import CODECS, get_decoder

from voice_agent.audio.concealment import MAX_CONCEALED_MS, G711Concealer
from voice_agent.rtc import internals, opus_wideband
from voice_agent.rtc.inbound import frame_to_mono_int16
from voice_agent.rtc.opus_wideband import DecodedAudio

log = logging.getLogger(__name__)

EXPECTED_PARAMETERS = ["loop", "input_q", "output_q", "decode_error"]
RTP_WRAP = 2**32  # RTP timestamps are 32-bit and wrap
G711_TYPES = ("audio/pcmu", "audio/pcma")
G711_RATE = 8_000
G711_TIME_BASE = fractions.Fraction(1, G711_RATE)
OPUS_CLOCK = 48_000  # Opus's RTP clock, whatever the rate it is decoded at
OPUS_TICKS_PER_SAMPLE = OPUS_CLOCK // opus_wideband.SAMPLE_RATE


def decoder_worker(
    loop: asyncio.AbstractEventLoop,
    input_q: queue.Queue[Any],
    output_q: asyncio.Queue[Any],
    decode_error: threading.Event,
) -> None:
    """aiortc's decoder loop, with one ``call_soon_threadsafe`` per frame."""
    if isinstance(input_q, InlineDecoder):
        return  # the receiver decodes on the event loop: no thread needed
    deliver = output_q.put_nowait
    codec_name = None
    decoder: Any = None
    while True:
        task = input_q.get()
        if task is None:
            _hand_over(loop, deliver, None)  # the track has ended
            return
        codec, encoded_frame = task
        if codec.name != codec_name:
            decoder = get_decoder(codec)
            codec_name = codec.name
        try:
            frames = decoder.decode(encoded_frame)
        except av.FFmpegError as exc:
            # Keep the decoder's state, as aiortc does: a reset would fail
            # every frame until the next key frame.
            log.warning("failed to decode a %s frame: %s", codec.name, exc)
            decode_error.set()
            continue
        for frame in frames:
            if not _hand_over(loop, deliver, frame):
                return


def _hand_over(loop: asyncio.AbstractEventLoop, deliver: Any, frame: Any) -> bool:
    try:
        loop.call_soon_threadsafe(deliver, frame)
    except RuntimeError:  # the loop is closed: nobody is listening any more
        return False
    return True


class InlineDecoder:
    """Stands in for a receiver's decoder queue (``put`` only): decodes each
    frame as it is put, on the event loop, into the track's queue.

    Packets that never arrived are found from the RTP timestamps (the next
    one expected is the last one's plus its length) and filled in before
    the packet after them, stamped where they belong: G.711 by repeating
    the last pitch periods into the next packet's first
    (``audio.concealment``), Opus decoded to 16 kHz by libopus, from the
    next packet's FEC where it has some. A jump back, or forward by more
    than MAX_CONCEALED_MS, is no loss but a new stream (another sender, a
    pause in sending): nothing is invented for it.
    ``conceal=False`` hands on what arrived and nothing else."""

    def __init__(self, receiver: Any, opus_16k: bool = False, conceal: bool = True) -> None:
        self._receiver = receiver
        self._opus_16k = opus_16k and opus_wideband.available()
        self._conceal = conceal
        self._codec_name: str | None = None
        self._decoder: Any = None
        self._wideband: opus_wideband.WidebandOpusDecoder | None = None
        self._concealer: G711Concealer | None = None
        self._next_timestamp: int | None = None  # where the next packet should start
        self._last_length = 0  # the last packet's length, in RTP clock ticks
        self.concealed_frames = 0  # lost packets filled in
        self.recovered_frames = 0  # ...of which decoded from the next packet's FEC (Opus)

    def put(self, task: Any) -> None:
        output: asyncio.Queue[Any] = self._receiver._track._queue
        if task is None:  # the receiver stops: so does its track
            if self._wideband is not None:
                self._wideband.close()
                self._wideband = None
            self._restart_g711(output)
            if self.concealed_frames:
                log.info(
                    "caller's lost audio concealed",
                    extra={
                        "codec": self._codec_name,
                        "concealed_frames": self.concealed_frames,
                        "fec_frames": self.recovered_frames,
                    },
                )
            output.put_nowait(None)
            return
        codec, encoded_frame = task
        if not encoded_frame.data:
            # A packet of padding only: no audio in it. (FFmpeg would take an
            # empty packet for the end of the stream and decode nothing more.)
            # One where the next audio was due stands for it: the sender sent
            # nothing there, nothing was lost, and nothing is made up.
            if self._missing(encoded_frame.timestamp, codec.clockRate) == 0:
                if self._concealer is not None:
                    self._restart_g711(output)  # what it holds is stamped before the hole
                else:
                    self._arrived(encoded_frame.timestamp, self._last_length)
            return
        if self._opus_16k and codec.mimeType.lower() == "audio/opus":
            # Straight to the 16 kHz mono the session listens to.
            if self._codec_name != codec.name:
                self._restart_g711(output)
                self._codec_name, self._decoder, self._concealer = codec.name, None, None
            try:
                if self._wideband is None:
                    self._wideband = opus_wideband.WidebandOpusDecoder()
                self._fill_opus_gap(encoded_frame, output)
                audio = self._wideband.decode(encoded_frame.data, encoded_frame.timestamp)
            except opus_wideband.OpusDecodeError as exc:
                log.warning("failed to decode an opus frame: %s", exc)
                self._receiver._RTCRtpReceiver__decoder_error.set()
                return
            self._arrived(encoded_frame.timestamp, len(audio.samples) * OPUS_TICKS_PER_SAMPLE)
            output.put_nowait(audio)
            return
        if codec.name != self._codec_name:
            self._restart_g711(output)
            self._decoder = get_decoder(codec)
            self._codec_name = codec.name
            g711 = self._conceal and codec.mimeType.lower() in G711_TYPES
            self._concealer = G711Concealer() if g711 else None
        try:
            frames = self._decoder.decode(encoded_frame)
        except av.FFmpegError as exc:  # keep the decoder's state, as aiortc does
            log.warning("failed to decode a %s frame: %s", codec.name, exc)
            self._receiver._RTCRtpReceiver__decoder_error.set()
            return
        if self._concealer is not None and frames:
            self._conceal_g711(encoded_frame.timestamp, frames, output)
            return
        for frame in frames:
            output.put_nowait(frame)

    # -- losses ---------------------------------------------------------------
    def _missing(self, timestamp: int, clock_rate: int) -> int | None:
        """Clock ticks lost just before a packet stamped ``timestamp``: 0
        when it follows the last one, None when it starts a new stream."""
        expected = self._next_timestamp
        if expected is None or not self._last_length:
            return None
        ahead = (timestamp - expected) % RTP_WRAP
        if ahead > clock_rate * MAX_CONCEALED_MS // 1000:  # backward (wrapped), or too far
            return None
        return ahead

    def _arrived(self, timestamp: int, length: int) -> None:
        self._next_timestamp = (timestamp + length) % RTP_WRAP
        self._last_length = length

    def _fill_opus_gap(self, encoded_frame: Any, output: asyncio.Queue[Any]) -> None:
        """Each lost frame in front of this packet, by PLC; the last one
        from this packet's FEC."""
        assert self._wideband is not None
        missing = self._missing(encoded_frame.timestamp, OPUS_CLOCK) if self._conceal else None
        if not missing or missing % (opus_wideband.GRANULE_SAMPLES * OPUS_TICKS_PER_SAMPLE):
            return  # in sequence, a new stream, or not a whole number of Opus frames
        assert self._next_timestamp is not None
        timestamp, frame = self._next_timestamp, self._last_length
        while missing > 0:
            length = min(frame, missing)
            samples = length // OPUS_TICKS_PER_SAMPLE
            try:
                if missing > frame:
                    audio = self._wideband.conceal(samples, timestamp)
                else:
                    audio = self._wideband.recover(encoded_frame.data, samples, timestamp)
            except opus_wideband.OpusDecodeError as exc:  # the packet itself may still decode
                log.warning("failed to conceal a lost opus frame: %s", exc)
                return
            if missing <= frame and self._wideband.has_fec(encoded_frame.data):
                self.recovered_frames += 1
            output.put_nowait(audio)
            self.concealed_frames += 1
            timestamp, missing = (timestamp + length) % RTP_WRAP, missing - length

    def _conceal_g711(self, timestamp: int, frames: list[Any], output: asyncio.Queue[Any]) -> None:
        """This packet through the concealer, the gap before it filled in
        first; every piece stamped with where its first sample belongs (the
        concealer hands on its input a few milliseconds late)."""
        concealer = self._concealer
        assert concealer is not None
        samples = np.concatenate([frame_to_mono_int16(frame) for frame in frames])
        missing = self._missing(timestamp, G711_RATE)
        if missing is None:
            self._restart_g711(output)
        elif missing:
            assert self._next_timestamp is not None
            # The whole gap at once, from both sides: this packet is its end.
            held = concealer.held
            filled = concealer.lost(missing, following=samples)
            # One piece per lost packet, cut where the concealer's output
            # reached the end of each (the first also takes the samples held
            # before the gap); the output starts at the gap's start less those.
            cuts = [
                min(len(filled), max(0, held + end - concealer.held))
                for end in range(self._last_length, missing, self._last_length)
            ]
            start = (self._next_timestamp - held) % RTP_WRAP
            for piece in np.split(filled, cuts):
                if len(piece):
                    output.put_nowait(DecodedAudio(piece, start, G711_RATE, G711_TIME_BASE))
                start = (start + len(piece)) % RTP_WRAP
                self.concealed_frames += 1
        end = (timestamp + len(samples)) % RTP_WRAP
        self._hand_on(concealer.good(samples), end, output)
        self._arrived(timestamp, len(samples))

    def _hand_on(self, samples: np.ndarray, end: int, output: asyncio.Queue[Any]) -> None:
        """Samples from the concealer, whose input has reached RTP time ``end``."""
        assert self._concealer is not None
        if len(samples):
            start = (end - self._concealer.held - len(samples)) % RTP_WRAP
            output.put_nowait(DecodedAudio(samples, start, G711_RATE, G711_TIME_BASE))

    def _restart_g711(self, output: asyncio.Queue[Any]) -> None:
        """What the concealer holds back, handed on: a new stream follows."""
        if self._concealer is not None and self._next_timestamp is not None:
            self._hand_on(self._concealer.restart(), self._next_timestamp, output)
        self._next_timestamp = None


def decode_inline(receiver: Any, opus_16k: bool = False) -> bool:
    """Decode this audio receiver's frames on the event loop (Opus straight
    to 16 kHz mono with ``opus_16k``); False (and nothing changed) unless
    this module's thread function is installed and the receiver has not
    started."""
    if receiver_module.decoder_worker is not decoder_worker:
        return False
    if getattr(receiver, "_RTCRtpReceiver__decoder_thread", True) is not None:
        return False  # started already, or not the receiver this was written for
    if not isinstance(getattr(receiver, "_RTCRtpReceiver__decoder_queue", None), queue.Queue):
        return False
    receiver._RTCRtpReceiver__decoder_queue = InlineDecoder(receiver, opus_16k)
    return True


def install() -> bool:
    """Use this hand-off for every receiver created from now on."""
    current = receiver_module.decoder_worker
    if current is decoder_worker:
        return True
    if not internals.patchable("decoder hand-off"):
        return False
    if list(inspect.signature(current).parameters) != EXPECTED_PARAMETERS:
        log.warning("aiortc's decoder_worker changed shape: keeping aiortc's own hand-off")
        return False
    receiver_module.decoder_worker = decoder_worker
    return True


def ask_for_fec() -> None:
    """Say ``useinbandfec=1`` in every Opus answer from now on (process-wide,
    like aiortc's codec table, which is where it goes): a sender adds FEC
    only when the receiver's description asks for it, and without FEC the
    one frame before each packet that arrived is guessed instead of decoded."""
    for codec in CODECS["audio"]:
        if codec.mimeType.lower() == "audio/opus":
            codec.parameters["useinbandfec"] = 1
