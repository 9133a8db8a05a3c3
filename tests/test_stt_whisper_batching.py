"""faster-whisper is one model shared by every session: concurrent finals
are batched through one worker, and speculative work is shed while finals
wait."""

from __future__ import annotations

import asyncio

from tests.audio_data import librivox, reference, word_error_rate
from voice_agent.backends.stt_faster_whisper import FasterWhisperStt, without_restart

CLIPS = ["0930", "0880", "0890", "0920"]


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


async def test_speculation_is_shed_while_a_final_waits() -> None:
    stt = FasterWhisperStt("base", "en", 2, max_batch=1, batch_wait_ms=0)
    try:
        final = asyncio.create_task(stt.transcribe(librivox("0930")))
        await asyncio.sleep(0)  # the final is queued (or running)
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
