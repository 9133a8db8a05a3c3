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
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import queue
import threading
from typing import Any

import aiortc.rtcrtpreceiver as receiver_module
import av
from aiortc.codecs import get_decoder

from voice_agent.rtc import internals, opus_wideband

log = logging.getLogger(__name__)

EXPECTED_PARAMETERS = ["loop", "input_q", "output_q", "decode_error"]


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
    frame as it is put, on the event loop, into the track's queue."""

    def __init__(self, receiver: Any, opus_16k: bool = False) -> None:
        self._receiver = receiver
        self._opus_16k = opus_16k and opus_wideband.available()
        self._codec_name: str | None = None
        self._decoder: Any = None
        self._wideband: opus_wideband.WidebandOpusDecoder | None = None

    def put(self, task: Any) -> None:
        output: asyncio.Queue[Any] = self._receiver._track._queue
        if task is None:  # the receiver stops: so does its track
            if self._wideband is not None:
                self._wideband.close()
                self._wideband = None
            output.put_nowait(None)
            return
        codec, encoded_frame = task
        if not encoded_frame.data:
            # A packet of padding only: no audio in it. (FFmpeg would take an
            # empty packet for the end of the stream and decode nothing more.)
            return
        if self._opus_16k and codec.mimeType.lower() == "audio/opus":
            # Straight to the 16 kHz mono the session listens to.
            try:
                if self._wideband is None:
                    self._wideband = opus_wideband.WidebandOpusDecoder()
                audio = self._wideband.decode(encoded_frame.data, encoded_frame.timestamp)
            except opus_wideband.OpusDecodeError as exc:
                log.warning("failed to decode an opus frame: %s", exc)
                self._receiver._RTCRtpReceiver__decoder_error.set()
                return
            output.put_nowait(audio)
            return
        if codec.name != self._codec_name:
            self._decoder = get_decoder(codec)
            self._codec_name = codec.name
        try:
            frames = self._decoder.decode(encoded_frame)
        except av.FFmpegError as exc:  # keep the decoder's state, as aiortc does
            log.warning("failed to decode a %s frame: %s", codec.name, exc)
            self._receiver._RTCRtpReceiver__decoder_error.set()
            return
        for frame in frames:
            output.put_nowait(frame)


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
