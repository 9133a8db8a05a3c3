"""The paced outbound track: schedule, backpressure and flush.

Timing is checked in ways a busy host cannot break: a frame never leaves
before it is due (asyncio's timers do not fire early), so "not before" bounds
are exact; "sent at once" is counted in steps of the event loop, not
measured; and a bound on how late a frame may leave is a slot or more wide."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable

import av
import numpy as np
import pytest

from voice_agent.rtc.outbound import (
    DTX_HANGOVER_FRAMES,
    DTX_KEEPALIVE_FRAMES,
    FRAME_SAMPLES,
    PacedAudioTrack,
)
from voice_agent.testing.waiting import until

Frame = tuple[np.ndarray | None, int]
SLOT_S = 0.020
# A timer may fire up to the clock's resolution (1 ns) early: "not before" allows that.
EARLY_S = 1e-6


def tone(frames: int, value: int = 1000) -> np.ndarray:
    return np.full(frames * FRAME_SAMPLES, value, dtype=np.int16)


async def without_waiting(frame: Awaitable[Frame]) -> Frame:
    """``frame``'s result, which must be ready after one step of the event
    loop: the pacer sent it without waiting for a slot. Counted in steps,
    not timed, so a busy host cannot make a frame sent at once look late."""
    task = asyncio.ensure_future(frame)
    await asyncio.sleep(0)
    if not task.done():
        task.cancel()
        raise AssertionError("the pacer waited for a slot")
    return task.result()


async def next_level(track: PacedAudioTrack) -> int:
    """Peak of the next frame the track sends (0 for silence)."""
    samples, _ = await track.next_frame()
    return 0 if samples is None else int(np.abs(samples).max())


async def test_n_frames_take_n_times_20ms_without_drift() -> None:
    """A consumer that spends 5 ms on every frame (as an encoder does) must
    not slow the clock: frame n is due at start + n x 20 ms, not 25 ms."""
    track = PacedAudioTrack()
    n = 100
    started = time.monotonic()
    sent_at: list[float] = []
    for _ in range(n + 1):
        await track.next_frame()
        sent_at.append(time.monotonic())
        time.sleep(0.005)  # noqa: ASYNC251 - the encoder's share, blocking like real work
    # Frame n is due n x 20 ms after frame 0 and never leaves before; a busy
    # host may send it late, but nowhere near the 2.5 s of drifting pacing.
    assert sent_at[-1] - started >= n * SLOT_S - EARLY_S
    assert sent_at[-1] - sent_at[0] < n * SLOT_S + 0.25
    assert all(later >= earlier for earlier, later in itertools.pairwise(sent_at))
    assert track.stats.frames == n + 1
    track.stop()


async def test_packets_are_contiguous_decodable_opus() -> None:
    track = PacedAudioTrack()
    await track.write(
        tone(3, 8000) * np.sign(np.sin(np.arange(3 * FRAME_SAMPLES) / 7)).astype(np.int16)
    )
    packets = [await track.recv() for _ in range(6)]
    assert [p.pts for p in packets] == [i * FRAME_SAMPLES for i in range(6)]
    decoder = av.CodecContext.create("libopus", "r")
    decoded = [decoder.decode(p) for p in packets]
    peaks = [max(int(np.abs(f.to_ndarray()).max()) for f in frames) for frames in decoded]
    assert all(sum(f.samples for f in frames) == FRAME_SAMPLES for frames in decoded)
    assert min(peaks[1:3]) > 2000  # the tone (after the codec's 6.5 ms look-ahead)
    assert max(peaks[5:]) < 50  # then silence
    track.stop()


async def test_silence_when_idle_then_audio_in_order() -> None:
    track = PacedAudioTrack()
    assert await next_level(track) == 0
    await track.write(np.concatenate((tone(1, 100), tone(1, 200))))
    assert [await next_level(track) for _ in range(3)] == [100, 200, 0]
    track.stop()


async def test_writer_waits_while_the_buffer_is_full() -> None:
    track = PacedAudioTrack(buffer_ms=100)  # 5 frames
    writer = asyncio.create_task(track.write(tone(12)))
    # Not a wait for the writer to get going (its first step runs before
    # this timer is due): 50 ms in which nothing is consumed, at the end of
    # which it must still be waiting.
    await asyncio.sleep(0.05)
    assert not writer.done()  # backpressure: only the buffer's worth is queued
    assert track.buffered_frames == 5
    # Counted in audio frames, not slots: a pacer behind its clock (a busy
    # host) sends the frames due back to back without letting the writer
    # refill, and a slot among them may go out as silence.
    sent = 0
    async with asyncio.timeout(10):
        while sent < 12:
            samples, _ = await track.next_frame()
            sent += samples is not None
    await asyncio.wait_for(writer, 1.0)
    assert track.buffered_frames == 0
    track.stop()


async def test_flush_takes_effect_on_the_next_frame() -> None:
    track = PacedAudioTrack(buffer_ms=200)
    await track.write(tone(8))
    assert await next_level(track) > 0
    track.flush()
    assert await next_level(track) == 0
    assert track.buffered_frames == 0
    await asyncio.wait_for(track.drain(), 0.1)
    track.stop()


async def test_flush_releases_a_blocked_writer_without_queuing_its_rest() -> None:
    track = PacedAudioTrack(buffer_ms=40)
    writer = asyncio.create_task(track.write(tone(10)))
    await until(lambda: track.buffered_frames == 2)  # the buffer is full: the writer waits
    writer.cancel()  # a barge-in cancels the producer, then flushes
    track.flush()
    with pytest.raises(asyncio.CancelledError):
        await writer
    assert [await next_level(track) for _ in range(3)] == [0, 0, 0]
    track.stop()


async def test_audio_arriving_while_idle_is_not_held_to_the_next_slot() -> None:
    track = PacedAudioTrack()
    await track.next_frame()  # the clock starts
    receiving = asyncio.create_task(track.next_frame())
    await asyncio.sleep(0)  # one step: the pacer runs until it sleeps in the next slot
    written = time.monotonic()
    await track.write(tone(2))
    samples, pts = await without_waiting(receiving)  # sent at once, not in the slot's time
    assert samples is not None and np.abs(samples).max() > 0
    # The schedule re-anchors on that frame: its timestamp is the stream's
    # time now (sent early on the old schedule, it would be ahead of it)...
    assert track.position() >= pts
    # ...and the next one is due a whole slot after it.
    await track.next_frame()
    assert time.monotonic() - written >= SLOT_S - EARLY_S
    track.stop()


async def test_partial_tail_is_padded_and_reported_by_tag() -> None:
    track = PacedAudioTrack()
    seen: list[object] = []
    track.on_audio_frame = seen.append
    await track.write(np.full(FRAME_SAMPLES + 100, 500, dtype=np.int16), tag="reply-1")
    await track.finish()
    assert [await next_level(track) for _ in range(3)] == [500, 500, 0]
    assert seen == ["reply-1", "reply-1"]
    await asyncio.wait_for(track.drain(), 0.1)
    track.stop()


async def test_dtx_sends_one_silence_packet_per_400_ms_stamped_with_wall_clock_time() -> None:
    """Silence on a real clock: 1 s of idle track is 3 packets, not 50, and
    each packet's timestamp is the time it leaves (so a receiver sees a
    gap, not a slowed-down stream)."""
    track = PacedAudioTrack(dtx=True)
    started = time.monotonic()
    sent = []
    while time.monotonic() - started < 1.0:
        samples, pts = await track.next_frame()
        assert samples is None
        sent.append((time.monotonic() - started, pts))
    assert len(sent) == 4  # at 0, 0.4, 0.8 and 1.2 s
    for (at, pts), expected in zip(sent, (0.0, 0.4, 0.8, 1.2), strict=True):
        # Never before its time, and late by less than half the rhythm (a
        # busy host's delay): a 20 ms rhythm would send 50 packets, a 500 ms
        # one the third at 1.0 s.
        assert expected - EARLY_S <= at < expected + 0.2
        assert pts == round(expected * 50) * FRAME_SAMPLES
    assert track.stats.frames == 4
    track.stop()


async def test_dtx_audio_written_while_idle_leaves_at_once_in_the_slot_of_its_time() -> None:
    track = PacedAudioTrack(dtx=True)
    before = time.monotonic()
    await track.next_frame()  # the clock starts; the next packet would be at 400 ms
    after = time.monotonic()  # the stream's time 0 is between the two
    receiving = asyncio.create_task(track.next_frame())
    await asyncio.sleep(0.13)  # real time: 130 ms of DTX silence before the reply comes
    written = time.monotonic()
    await track.write(tone(3, 700))
    samples, pts = await without_waiting(receiving)  # at once, not at the next keepalive
    sent = time.monotonic()
    assert samples is not None and int(np.abs(samples).max()) == 700
    # Stamped with the slot of the time it left (6, 130 ms after the start, on
    # an idle host): not the next slot of the 20 ms schedule (1), nor the
    # keepalive's (20), whenever this host got to run the write.
    slot = pts // FRAME_SAMPLES
    assert int((written - after) / SLOT_S) <= slot <= int((sent - before) / SLOT_S)
    # Then the reply plays on the 20 ms schedule, then a hangover of silence
    # on the same schedule (so a receiver holding packets back releases the
    # reply's end at once), and then the stream goes quiet again.
    levels, stamps = [], []
    for _ in range(2 + DTX_HANGOVER_FRAMES + 1):
        frame, stamp = await track.next_frame()
        levels.append(0 if frame is None else int(np.abs(frame).max()))
        stamps.append(stamp)
    assert levels == [700, 700] + [0] * (DTX_HANGOVER_FRAMES + 1)
    slots = [stamp // FRAME_SAMPLES for stamp in stamps]
    scheduled = 2 + DTX_HANGOVER_FRAMES
    assert slots[:scheduled] == list(range(slots[0], slots[0] + scheduled))
    # The next keepalive: the first slot of its 400 ms rhythm after the hangover.
    keepalive = -(-(slots[-2] + 1) // DTX_KEEPALIVE_FRAMES) * DTX_KEEPALIVE_FRAMES
    assert slots[-1] == keepalive
    track.stop()


async def _reply_send_times(
    track: PacedAudioTrack, frames: int, lead: int
) -> tuple[list[float], list[int], float]:
    """Write a reply while the track is idle in DTX; the times (from the
    write) and stream slots at which its frames leave, and when it was
    written. Its first frame and the ``lead`` after it must leave at once
    (see ``without_waiting``)."""
    receiving = asyncio.create_task(track.next_frame())
    await asyncio.sleep(0.05)  # real time: 50 ms of DTX silence before the reply comes
    written = time.monotonic()
    await track.write(tone(frames, 600))
    times, slots = [], []
    result = await without_waiting(receiving)
    while True:
        samples, pts = result
        if samples is None:
            break
        times.append(time.monotonic() - written)
        slots.append(pts // FRAME_SAMPLES)
        following = track.next_frame()
        result = await (without_waiting(following) if len(times) <= lead else following)
    return times, slots, written


async def test_lead_sends_a_replys_first_frames_at_once_then_keeps_the_20ms_schedule() -> None:
    """A receiver that holds 4 packets back plays the first frame the moment
    the 5th arrives: with a lead of 4 they all leave together."""
    track = PacedAudioTrack(dtx=True, lead_frames=4)
    await track.next_frame()  # the clock starts; the track is idle
    # The first frame and the 4 of the lead leave at once.
    times, slots, _ = await _reply_send_times(track, 8, lead=4)
    assert slots == list(range(slots[0], slots[0] + 8))  # contiguous timestamps
    # The rest on the 20 ms schedule, 4 frames ahead of it: frame k is due
    # (k - 4) x 20 ms after the lead left, so never sooner after the write,
    # and long before its own slot (k x 20 ms), which it would wait for had
    # the lead been given back.
    for k in range(5, 8):
        assert (k - 4) * SLOT_S - EARLY_S <= times[k] < k * SLOT_S
    track.stop()


async def test_lead_does_not_accumulate_from_one_reply_to_the_next() -> None:
    """Each reply gets its lead again, and the stream's timestamps stay those
    of the wall clock: a receiver playing by timestamp (and the echo
    canceller's far end) never sees the stream drift ahead."""
    track = PacedAudioTrack(dtx=True, lead_frames=4)
    before = time.monotonic()
    await track.next_frame()
    after = time.monotonic()  # the stream's time 0 is between the two
    for reply in range(1, 4):
        # The first 5 frames leave at once: the lead is taken again...
        times, slots, written = await _reply_send_times(track, 8, lead=4)
        assert times[5] >= SLOT_S - EARLY_S  # ...and is 4 again, not 8
        # The first frame's timestamp against the wall clock, in slots: never
        # ahead of the time it left (where a lead taken into the timestamps
        # would put it), and behind it by under a slot per reply so far (each
        # reply re-anchors the schedule on its first frame, by under a slot).
        left = written + times[0]
        assert (written - after) / SLOT_S - reply < slots[0] <= (left - before) / SLOT_S
        for _ in range(DTX_HANGOVER_FRAMES + 1):  # the hangover, then DTX silence
            samples, _ = await track.next_frame()
            assert samples is None
    track.stop()


@pytest.mark.parametrize(("dtx", "codec"), [(False, "audio/opus"), (True, "audio/PCMU")])
async def test_no_lead_without_dtx_or_on_a_g711_leg(dtx: bool, codec: str) -> None:
    """A stream without gaps has no moment the lead could be reset at, and
    G.711 (a phone) never has DTX: every frame keeps its own slot."""
    track = PacedAudioTrack(dtx=dtx, lead_frames=4)
    track.use_codec(codec)
    before = time.monotonic()
    await track.next_frame()  # slot 0, at the stream's start
    await asyncio.sleep(0.005)  # real time: the reply comes into slot 1 (anywhere in it would do)
    await track.write(tone(4, 600))
    sent = []
    for _ in range(4):
        await track.next_frame()
        sent.append(time.monotonic() - before)
    # Frame k waits for its own slot, k x 20 ms after the start (a lead
    # would send all four at once).
    for k, at in enumerate(sent, start=1):
        assert at >= k * SLOT_S - EARLY_S, sent
    track.stop()


def test_a_lead_as_long_as_the_buffer_is_refused() -> None:
    with pytest.raises(ValueError, match="lead_frames"):
        PacedAudioTrack(buffer_ms=100, dtx=True, lead_frames=5)
