"""The outbound audio track: 20 ms frames on an absolute clock.

aiortc's RTP sender pulls ``recv()`` as fast as it returns, so the track itself
is the pacer. Frame *n* is due at ``start + n * 20 ms``: computing each
deadline from the start (rather than sleeping 20 ms after the previous frame)
means scheduling jitter never accumulates into drift. Between utterances the
track sends silence, so the receiver's jitter buffer never underruns.

Writers go through a small bounded buffer and wait when it is full
(backpressure), so TTS can run ahead by at most ``buffer_ms``. ``flush()``
drops everything buffered: the very next frame on the wire is silence.

With ``dtx`` (discontinuous transmission, as Opus DTX does) the silence
between replies is one packet every 400 ms instead of one every 20 ms. An
idle call is most of a call's life, and each packet costs aiortc's sender
its Python work (RTP, SRTP, a datagram). Timestamps keep counting wall-clock
time and sequence numbers stay contiguous, so a receiver's jitter buffer
sees a silence gap, not loss, and the first frame of a reply still leaves
the moment it is written.

With ``lead_frames`` (DTX only), the first frames of a reply that starts
after DTX silence leave back to back, and the rest of the reply keeps that
lead on the 20 ms schedule; their timestamps stay those of the wall clock.
A receiver that holds packets back before it plays (aiortc's jitter buffer
releases a frame once 4 more have arrived) then plays the reply's first
frame the moment it arrives, not 80 ms later; one that plays by timestamp
(a browser's NetEq) just holds a few more packets. The lead is given back
in the DTX silence after the reply, so it never accumulates.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from voice_agent.rtc.g711 import FrameEncoder, OpusFrames, encoder_for
from voice_agent.rtc.opus import make_packet

SAMPLE_RATE = 48_000
FRAME_MS = 20
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000
# Past this much lateness (a suspended process, a debugger) the clock restarts
# instead of bursting out seconds of catch-up audio.
RESYNC_AFTER_S = 0.5
# With DTX, one silence packet per this many slots (400 ms, Opus DTX's
# rhythm): keeps NAT bindings and the receiver's idea of the stream alive.
DTX_KEEPALIVE_FRAMES = 20
# After audio, this many silence packets go out on the 20 ms schedule before
# DTX begins (Opus DTX's hangover): a receiver that holds a few packets back
# (aiortc's jitter buffer releases a frame once 4 more have arrived) plays
# the end of a reply at once, not one keepalive later each.
DTX_HANGOVER_FRAMES = 8


@dataclass
class PacingStats:
    """How well the track kept its schedule."""

    frames: int = 0
    audio_frames: int = 0
    late_over_20ms: int = 0
    max_late_ms: float = 0.0
    resyncs: int = 0

    def merge(self, other: PacingStats) -> None:
        self.frames += other.frames
        self.audio_frames += other.audio_frames
        self.late_over_20ms += other.late_over_20ms
        self.max_late_ms = max(self.max_late_ms, other.max_late_ms)
        self.resyncs += other.resyncs

    def record(self, late_s: float) -> None:
        late_ms = late_s * 1000.0
        self.frames += 1
        if late_ms > 20.0:
            self.late_over_20ms += 1
        self.max_late_ms = max(self.max_late_ms, late_ms)


FrameListener = Callable[[Any], None]


class PacedAudioTrack(MediaStreamTrack):
    """Mono 48 kHz outbound track fed by ``write()`` and paced by ``recv()``.

    Every written chunk may carry a ``tag``; each of its frames reports it to
    ``on_audio_frame(tag)`` as it goes out, which is how the session knows
    exactly which words have been heard.
    """

    kind = "audio"

    def __init__(
        self,
        buffer_ms: int = 200,
        clock: Callable[[], float] = time.monotonic,
        dtx: bool = False,
        lead_frames: int = 0,
    ) -> None:
        super().__init__()
        self._clock = clock
        self._dtx = dtx
        self._capacity = max(2, buffer_ms // FRAME_MS)
        if not 0 <= lead_frames < self._capacity:
            raise ValueError(
                f"lead_frames must be 0-{self._capacity - 1} for a {buffer_ms} ms buffer"
            )
        self._lead_frames = lead_frames
        self._lead_left = 0  # frames of this reply that may still leave ahead of the clock
        # Seconds the frames now leave ahead of their slots (at most the
        # lead). Only sending moves: timestamps stay those of the wall clock,
        # so a receiver (and the echo canceller) sees the same stream.
        self._ahead = 0.0
        self._silent_slots = DTX_HANGOVER_FRAMES  # silence sent since the last audio
        self._frames: deque[tuple[np.ndarray, Any]] = deque()
        self._pending = np.zeros(0, dtype=np.int16)
        self._pending_tag: Any = None
        self._space = asyncio.Event()
        self._space.set()
        self._start: float | None = None
        self._index = 0
        self._encoder: FrameEncoder = OpusFrames()
        self.stats = PacingStats()
        self.on_audio_frame: FrameListener | None = None
        # Told every audio frame's samples and timestamp as it leaves (an
        # echo canceller's far end); silence is not reported.
        self.on_samples_sent: Callable[[np.ndarray, int], None] | None = None
        self._drained = asyncio.Event()
        self._drained.set()
        self._wake: asyncio.Future[bool] | None = None
        # Paused: slots go out as silence and the queued audio waits (the
        # caller may be interrupting; if not, the reply goes on from there).
        self._paused = False

    def use_codec(self, mime_type: str) -> None:
        """Send in the negotiated codec (Opus unless the peer chose G.711).

        G.711 has no DTX unless comfort noise is negotiated, and phones
        take gaps in its stream for loss: its silence is sent in full."""
        self._encoder = encoder_for(mime_type)
        if not mime_type.lower().endswith("/opus"):
            self._dtx = False

    # -- producer side ---------------------------------------------------
    @property
    def buffered_frames(self) -> int:
        return len(self._frames)

    async def write(self, samples: np.ndarray, tag: Any = None) -> None:
        """Queue mono int16 48 kHz samples; waits while the buffer is full."""
        if samples.dtype != np.int16:
            raise TypeError("expected int16 samples")
        data = np.concatenate((self._pending, samples)) if self._pending.size else samples
        offset = 0
        while len(data) - offset >= FRAME_SAMPLES:
            while len(self._frames) >= self._capacity:
                self._space.clear()
                await self._space.wait()
            end = offset + FRAME_SAMPLES
            self._frames.append((data[offset:end], tag))
            self._drained.clear()
            self._wake_pacer()
            offset = end
        self._pending = data[offset:]
        self._pending_tag = tag if self._pending.size else None

    async def finish(self) -> None:
        """Pad the last partial frame with silence so the tail is heard."""
        if not self._pending.size:
            return
        tail = np.zeros(FRAME_SAMPLES - self._pending.size, dtype=np.int16)
        frame, tag = np.concatenate((self._pending, tail)), self._pending_tag
        self._pending = np.zeros(0, dtype=np.int16)
        self._pending_tag = None
        while len(self._frames) >= self._capacity:
            self._space.clear()
            await self._space.wait()
        self._frames.append((frame, tag))
        self._drained.clear()
        self._wake_pacer()

    async def drain(self) -> None:
        """Wait until every queued frame has gone out."""
        await self._drained.wait()

    def _wake_pacer(self) -> None:
        if self._wake is not None:
            _resolve(self._wake, True)

    def flush(self) -> None:
        """Drop everything not yet sent: the next frame out is silence."""
        self._frames.clear()
        self._pending = np.zeros(0, dtype=np.int16)
        self._pending_tag = None
        self._lead_left = 0
        self._space.set()
        self._drained.set()

    def pause(self) -> None:
        """Send silence from the next slot on, keeping what is queued."""
        self._paused = True

    def resume(self) -> None:
        """Send the queued audio again, from where it stopped."""
        if self._paused:
            self._paused = False
            self._wake_pacer()

    @property
    def paused(self) -> bool:
        return self._paused

    def position(self) -> int:
        """The stream's timestamp now, in samples: frame timestamps follow
        the wall clock from the first frame on (DTX gaps included)."""
        if self._start is None:
            return 0
        return int((self._clock() - self._start) * SAMPLE_RATE)

    # -- consumer side (aiortc's RTP sender) ---------------------------------
    async def recv(self) -> av.Packet[Any]:
        """The next 20 ms as an encoded packet (Opus or G.711), on schedule."""
        samples, pts = await self.next_frame()
        payload = self._encoder.silence() if samples is None else self._encoder.encode(samples)
        return make_packet(payload, pts)

    async def next_frame(self) -> tuple[np.ndarray | None, int]:
        """Wait for the next 20 ms slot; return its samples (None for silence)
        and its timestamp in samples."""
        if self.readyState != "live":
            raise MediaStreamError
        now = self._clock()
        if self._start is None:
            self._start = now
        if self._dtx and not self._sendable() and self._silent_slots >= DTX_HANGOVER_FRAMES:
            now = await self._skip_silence(now)
        due = self._start + self._index * FRAME_MS / 1000.0 - self._ahead
        if self._lead_left > 0:
            if self._sendable() and due > now:
                # Sent now, not in its slot: the frames after it leave that much earlier too.
                self._ahead += due - now
                due = now
                self._lead_left -= 1
            elif not self._sendable():
                self._lead_left = 0  # the reply's audio ran out: no lead to take later
        if due > now:
            # While idle, audio arriving mid-slot goes out at once and the
            # schedule re-anchors on it: speech starts up to a frame sooner,
            # and the receiver's jitter buffer absorbs the one-off shift.
            woken_early = await self._sleep(due - now, interruptible=not self._sendable())
            now = self._clock()
            if woken_early:
                self._start = now + self._ahead - self._index * FRAME_MS / 1000.0
                due = now
        late = max(0.0, now - due)
        # A stall counts at its full length, also one the clock restarts after.
        self.stats.record(late)
        if late > RESYNC_AFTER_S:
            self._start = now - self._index * FRAME_MS / 1000.0
            self._ahead = 0.0
            self.stats.resyncs += 1

        if self._sendable():
            samples, tag = self._frames.popleft()
            if len(self._frames) < self._capacity:
                self._space.set()
            if not self._frames and not self._pending.size:
                self._drained.set()
            self.stats.audio_frames += 1
            self._silent_slots = 0
            if self.on_audio_frame is not None:
                self.on_audio_frame(tag)
            if self.on_samples_sent is not None:
                self.on_samples_sent(samples, self._index * FRAME_SAMPLES)
        else:
            samples = None
            self._silent_slots += 1
        pts = self._index * FRAME_SAMPLES
        self._index += 1
        return samples, pts

    def _sendable(self) -> bool:
        return bool(self._frames) and not self._paused

    async def _skip_silence(self, now: float) -> float:
        """Nothing to send: sleep to the next keepalive slot, or until audio
        is written. The slots slept through are never sent, but they count:
        the next packet's timestamp is the wall-clock time it leaves at."""
        assert self._start is not None
        self._ahead = 0.0  # the silence gives a reply's lead back: keepalives keep their slots
        slot_s = FRAME_MS / 1000.0
        keepalive = -(-self._index // DTX_KEEPALIVE_FRAMES) * DTX_KEEPALIVE_FRAMES
        due = self._start + keepalive * slot_s
        if due <= now:
            return now
        woken = await self._sleep(due - now, interruptible=True)
        now = self._clock()
        if not woken:
            self._index = keepalive
            return now
        # Audio arrived: it leaves now, in the slot that now falls in, and the
        # schedule re-anchors on it (a shift of under one frame). Any lead the
        # previous reply took is gone with the silence; this reply may take its own.
        self._index = max(self._index, int((now - self._start) / slot_s))
        self._start = now - self._index * slot_s
        self._lead_left = self._lead_frames
        return now

    async def _sleep(self, delay: float, interruptible: bool) -> bool:
        """Sleep ``delay`` seconds; True when new audio cut the sleep short."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[bool] = loop.create_future()
        timer = loop.call_later(delay, _resolve, waiter, False)
        if interruptible:
            self._wake = waiter
        try:
            return await waiter
        finally:
            timer.cancel()
            self._wake = None


def _resolve(waiter: asyncio.Future[bool], woken_by_audio: bool) -> None:
    if not waiter.done():
        waiter.set_result(woken_by_audio)
