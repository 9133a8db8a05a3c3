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

log = logging.getLogger(__name__)

EXPECTED_PARAMETERS = ["loop", "input_q", "output_q", "decode_error"]


def decoder_worker(
    loop: asyncio.AbstractEventLoop,
    input_q: queue.Queue[Any],
    output_q: asyncio.Queue[Any],
    decode_error: threading.Event,
) -> None:
    """aiortc's decoder loop, with one ``call_soon_threadsafe`` per frame."""
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


def install() -> bool:
    """Use this hand-off for every receiver created from now on."""
    current = receiver_module.decoder_worker
    if current is decoder_worker:
        return True
    if list(inspect.signature(current).parameters) != EXPECTED_PARAMETERS:
        log.warning("aiortc's decoder_worker changed shape: keeping aiortc's own hand-off")
        return False
    receiver_module.decoder_worker = decoder_worker
    return True
