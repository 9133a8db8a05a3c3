"""faster-whisper is one model shared by every session: concurrent finals
are batched through one worker, and speculative work is shed while finals
wait."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path

import numpy as np
import pytest

from voice_agent.backends.stt.whisper import PARTIAL_BUSY_SHARE, FasterWhisperStt
from voice_agent.backends.stt.whisper_batch import without_restart
from voice_agent.testing.audio_data import librivox, reference, word_error_rate

CLIPS = ["0930", "0880", "0890", "0920"]


async def queued(stt: FasterWhisperStt) -> None:
    """Until the request just submitted waits in the main model's queue (or
    runs): a step or two of the event loop that no event marks."""
    async with asyncio.timeout(10):
        while not stt._worker.busy:  # noqa: ASYNC110
            await asyncio.sleep(0)


@pytest.mark.models
async def test_concurrent_finals_are_batched_and_heard_as_well_as_alone() -> None:
    stt = FasterWhisperStt("base", "en", 2, max_batch=8, batch_wait_ms=300)
    try:
        # Two callers saying the same thing at once share one encoder pass...
        same = await asyncio.gather(*(stt.transcribe(librivox("0930")) for _ in range(2)))
        assert stt.stats()["max_batch_seen"] == 2
        assert same[0] == same[1] and word_error_rate(reference("0930"), same[0]) <= 0.15
        # ...and clips of different lengths are batched but never padded far
        # past their end (Whisper would read them again into the silence).
        together = await asyncio.gather(*(stt.transcribe(librivox(c)) for c in CLIPS))
        for clip, text in zip(CLIPS, together, strict=True):
            assert word_error_rate(reference(clip), text) <= 0.15, (clip, text)
    finally:
        stt.close()


@pytest.mark.models
async def test_speculation_is_shed_while_a_final_waits() -> None:
    stt = FasterWhisperStt("base", "en", 2, max_batch=1, batch_wait_ms=0)
    try:
        final = asyncio.create_task(stt.transcribe(librivox("0930")))
        await queued(stt)
        assert await stt.transcribe_speculative(librivox("0880")) is None
        assert word_error_rate(reference("0930"), await final) <= 0.15
        # With nothing waiting, speculation runs.
        text = await stt.transcribe_speculative(librivox("0880"))
        assert text is not None and word_error_rate(reference("0880"), text) <= 0.15
        assert stt.stats()["requests"]["partial_skipped"] == 1  # type: ignore[index]
    finally:
        stt.close()


def test_a_transcript_that_starts_over_is_cut_where_it_restarts() -> None:
    # Seen on Opus-coded LibriVox 0920 over WebRTC: the sentence, then its start again.
    heard = (
        "Had he married a more amiable woman he might have been made still more "
        "respectable than he was. Had he married a more amiable woman he might have had"
    )
    assert without_restart(heard) == heard.split(" Had he married", 1)[0]
    # A repeated phrase that is not a restart of the utterance stays.
    assert without_restart("I went home. I went home to see") == "I went home. I went home to see"
    assert without_restart("Go on. Go on and on and on.") == "Go on. Go on and on and on."


@pytest.mark.models
async def test_a_speculation_dropped_while_it_is_encoded_is_never_decoded() -> None:
    stt = FasterWhisperStt("base", "en", 2, max_batch=1, batch_wait_ms=0)
    try:
        # ~15 s of speech (under Whisper's 30 s window): a long encoder pass.
        long = np.concatenate([librivox(c) for c in ("0930", "0890", "0920")])
        assert len(long) < 25 * 16000
        speculation = asyncio.create_task(stt.transcribe_speculative(long))
        # Nothing signals a batch's start, so the test looks for it.
        async with asyncio.timeout(30):
            while not stt.in_flight:  # noqa: ASYNC110
                await asyncio.sleep(0.001)
        speculation.cancel()  # the user spoke on
        with contextlib.suppress(asyncio.CancelledError):
            await speculation
        # The next request waits only for the encoder pass in progress, and
        # is heard as well as ever.
        text = await stt.transcribe(librivox("0880"))
        assert word_error_rate(reference("0880"), text) <= 0.15
        assert stt.stats()["abandoned_after_encoding"] == 1
    finally:
        stt.close()


SCHED_IDLE = 5


def thread_cpu(policy: int) -> dict[int, int]:
    """CPU ticks of this process's threads that run under ``policy``."""
    ticks: dict[int, int] = {}
    for tid in os.listdir("/proc/self/task"):
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        if int(fields[38]) == policy:
            ticks[int(tid)] = int(fields[11]) + int(fields[12])
    return ticks


@pytest.mark.models
async def test_partials_run_on_an_idle_priority_model_only_while_no_transcript_waits() -> None:
    stt = FasterWhisperStt("base", "en", 2, partial_lane="idle")
    try:
        await stt.warm_up()
        before = thread_cpu(SCHED_IDLE)
        assert before, "the partial model computes in idle-priority threads"
        text = await stt.transcribe_partial(librivox("0920"))
        assert text is not None and word_error_rate(reference("0920"), text) <= 0.15
        after = thread_cpu(SCHED_IDLE)
        # Those threads did the partial's work (a second of CPU or so), and
        # the main model's lane was not used for it.
        assert sum(after.values()) - sum(before.values()) >= 10
        lane = stt.stats()["partial_lane"]
        assert isinstance(lane, dict) and lane["requests"]["partial"] == 1
        assert stt.stats()["requests"]["partial"] == 0  # type: ignore[index]
        # While a transcript that matters is being made, no partial starts.
        final = asyncio.create_task(stt.transcribe(librivox("0930")))
        await queued(stt)
        assert await stt.transcribe_partial(librivox("0880")) is None
        assert word_error_rate(reference("0930"), await final) <= 0.15
        lane = stt.stats()["partial_lane"]
        assert isinstance(lane, dict) and lane["requests"]["partial"] == 1
    finally:
        stt.close()


@pytest.mark.models
async def test_a_partial_drafts_the_final_and_none_runs_while_the_model_is_busy() -> None:
    stt = FasterWhisperStt("base", "en", 2, max_batch=1, batch_wait_ms=0)
    try:
        assert stt.default_partial_interval_ms == 0  # on with --stt-partial-interval-ms
        clip = librivox("0870")
        # The caller still speaking, two thirds in: the partial's tokens are
        # the draft of the whole turn's transcript.
        partial = await stt.transcribe_partial(clip[: len(clip) * 2 // 3])
        assert partial is not None and len(partial.split()) >= 5
        final = await stt.transcribe(clip)
        assert word_error_rate(reference("0870"), final) <= 0.15
        assert stt.stats()["drafted"] == 1
        # Transcripts that matter keep the model busy: partials stop.
        for _ in range(20):
            if stt._worker.busy_share.share() > PARTIAL_BUSY_SHARE:
                break
            await stt.transcribe(librivox("0930"))
        assert await stt.transcribe_partial(clip[:16000]) is None
        assert stt.stats()["partial_model_busy"] == 1
        assert stt.stats()["requests"]["partial"] == 1  # type: ignore[index]
    finally:
        stt.close()
