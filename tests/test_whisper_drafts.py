"""A turn's transcript at a pause drafts its transcript at the end
(backends/stt/whisper_drafts.py, whisper_onnx_decoder.py): the draft's
tokens are checked in one decoder step, and the words are what decoding
without a draft gives."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from voice_agent.backends.stt.whisper import FasterWhisperStt
from voice_agent.backends.stt.whisper_batch import BatchTranscriber, Utterance
from voice_agent.backends.stt.whisper_drafts import KEPT, RecentTranscripts
from voice_agent.testing.audio_data import librivox

# LibriVox 0870: "And Mr. John Dashwood had then leisure to consider | how
# much ...", a reader's pause of ~0.4 s at 3.9 s.
CLIP, PAUSE_S = "0870", 3.94


def audio_of(*values: int) -> np.ndarray:
    return np.asarray(values, dtype=np.int16)


def test_a_draft_is_the_latest_transcript_of_audio_this_begins_with() -> None:
    recent = RecentTranscripts()
    recent.remember(audio_of(1, 2), [10, 12])
    recent.remember(audio_of(7, 8), [70])
    assert recent.draft_for(audio_of(1, 2, 5)) == (10, 12)
    recent.remember(audio_of(1, 2, 3), [10, 11])  # the same turn, heard further
    assert recent.draft_for(audio_of(1, 2, 3, 4)) == (10, 11)  # of two alike, the later
    assert recent.draft_for(audio_of(1, 2, 5)) == ()  # the earlier one gave way
    assert recent.draft_for(audio_of(1, 2, 3)) == (10, 11)  # the same audio again
    assert recent.draft_for(audio_of(7, 8, 9)) == (70,)
    assert recent.draft_for(audio_of(1)) == ()  # shorter than any
    assert recent.draft_for(audio_of(2, 1, 3)) == ()  # another start
    assert recent.drafted == 4
    # A speculation dropped after one token hides nothing longer.
    recent.remember(audio_of(1, 2, 3, 4), [10])
    assert recent.draft_for(audio_of(1, 2, 3, 4, 5)) == (10, 11)


def test_only_the_latest_few_are_kept_and_nothing_empty() -> None:
    recent = RecentTranscripts()
    recent.remember(audio_of(5), [50])
    recent.remember(audio_of(), [1])
    assert recent.draft_for(audio_of(3)) == ()  # empty audio is no one's beginning
    recent.remember(audio_of(6), [])
    assert recent.draft_for(audio_of(6, 6)) == ()
    for n in range(KEPT):
        recent.remember(audio_of(9, n), [n])
    assert recent.draft_for(audio_of(5, 5)) == ()  # the oldest forgotten
    assert recent.draft_for(audio_of(6, 6)) == ()
    assert recent.draft_for(audio_of(9, KEPT - 1, 0)) == (KEPT - 1,)


def test_a_turn_heard_every_second_keeps_one_entry_and_others_theirs() -> None:
    recent = RecentTranscripts()
    recent.remember(audio_of(7, 8), [70, 71])  # another caller's turn
    turn = list(range(1, 3 * KEPT))
    for n in range(2, len(turn)):  # a partial a second, each a word longer
        recent.remember(audio_of(*turn[:n]), turn[:n])
    assert recent.draft_for(audio_of(7, 8, 9)) == (70, 71)
    assert recent.draft_for(audio_of(*turn)) == tuple(turn[:-1])


@pytest.fixture(scope="module")
def batches() -> Iterator[BatchTranscriber]:
    stt = FasterWhisperStt("base", "en", 2)
    yield stt._batches
    stt.close()


def decoder_steps(batches: BatchTranscriber, audio: np.ndarray) -> tuple[str, int]:
    """The transcript of ``audio`` and the decoder steps it took."""
    decoder = batches._onnx
    assert decoder is not None
    run, steps = decoder._run, 0

    def counted(*args: object) -> np.ndarray:
        nonlocal steps
        steps += 1
        return run(*args)  # type: ignore[arg-type]

    decoder._run = counted  # type: ignore[method-assign, assignment]
    try:
        (heard,) = batches.transcribe_batch([Utterance(audio)])
    finally:
        del decoder._run
    return heard.text, steps


@pytest.mark.models
def test_a_turn_heard_at_its_pause_drafts_its_end(batches: BatchTranscriber) -> None:
    turn = librivox(CLIP)
    batches.recent.clear()
    plain, plain_steps = decoder_steps(batches, turn)
    batches.recent.clear()
    at_pause, _ = decoder_steps(batches, turn[: int(PAUSE_S * 16_000)])
    assert at_pause and plain.startswith(at_pause.rstrip(".,"))
    drafted = batches.recent.drafted
    heard, steps = decoder_steps(batches, turn)
    assert batches.recent.drafted == drafted + 1
    assert heard == plain
    # Each token of the pause's words kept is a step not taken.
    assert steps <= plain_steps - len(at_pause.split())


@pytest.mark.models
def test_a_wrong_draft_changes_nothing(batches: BatchTranscriber) -> None:
    decoder = batches._onnx
    assert decoder is not None
    turn = librivox(CLIP).astype(np.float32) / 32768
    features = batches._features(turn)
    window = batches._window_frames(features.shape[1])
    padded = np.full((1, features.shape[0], window), features.max() - 2.0, dtype=np.float32)
    padded[0, :, : features.shape[1]] = features
    assert batches._encoder is not None
    encoded = batches._encoder.encode(padded)
    (plain,) = decoder.generate(encoded, batches._prompt, 200) or []
    wrong = [plain.tokens[0], *[t + 1 for t in plain.tokens[1:6]]]  # right, then wrong
    (drafted,) = decoder.generate(encoded, batches._prompt, 200, draft=wrong) or []
    assert drafted.tokens == plain.tokens
    assert drafted.no_speech_prob == pytest.approx(plain.no_speech_prob, abs=1e-4)
    # Its first token's log-probability came from the one step over many
    # positions: the same up to rounding.
    assert drafted.avg_logprob == pytest.approx(plain.avg_logprob, abs=0.01)
