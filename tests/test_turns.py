"""Turn detection on recorded speech, through the real WebRTC VAD."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from voice_agent.backends.vad.silero import SileroVad
from voice_agent.backends.vad.webrtc import WebRtcVad
from voice_agent.config import Settings
from voice_agent.engine import turn_config
from voice_agent.stages.turns import (
    FRAME_SAMPLES,
    EndCandidate,
    Paused,
    Resumed,
    SpeechStarted,
    TurnConfig,
    TurnDetector,
    TurnEnded,
    TurnEvent,
)
from voice_agent.stages.vad import SpeechDetector
from voice_agent.testing.audio_data import goforward, librivox, silence, speech_bounds, with_pause


def run(audio: np.ndarray, config: TurnConfig, vad: str = "webrtc") -> list[TurnEvent]:
    speech = SpeechDetector(WebRtcVad(3) if vad == "webrtc" else SileroVad())
    detector = TurnDetector(config)
    events: list[TurnEvent] = []
    for start in range(0, len(audio) - FRAME_SAMPLES + 1, FRAME_SAMPLES):
        frame = audio[start : start + FRAME_SAMPLES]
        events += detector.push(frame, speech.probability(frame))
    return events


@pytest.mark.parametrize("vad", ["webrtc", pytest.param("silero", marks=pytest.mark.models)])
@pytest.mark.parametrize("clip", ["0880", "0930"])
def test_one_utterance_is_one_turn(clip: str, vad: str) -> None:
    speech = librivox(clip)
    audio = np.concatenate((silence(1.0), speech, silence(1.5)))
    onset, end = speech_bounds(speech)
    config = TurnConfig(turn_silence_ms=600, threshold=0.5)
    events = run(audio, config, vad)

    started = [e for e in events if isinstance(e, SpeechStarted)]
    ended = [e for e in events if isinstance(e, TurnEnded)]
    assert len(started) == 1 and len(ended) == 1
    # The onset is found within 0.25 s of the speech (an audible breath may
    # come first), and the turn reaches back before it by the pre-roll, so
    # the first syllable is kept.
    detected = (started[0].audio_start_ms + config.preroll_ms) / 1000
    assert detected == pytest.approx(1.0 + onset, abs=0.25)
    assert started[0].audio_start_ms / 1000 <= 1.0 + onset - 0.1
    # The turn ends at the last word (not at the end of the trailing silence).
    assert ended[0].audio_end_ms / 1000 == pytest.approx(1.0 + end, abs=0.25)
    assert ended[0].silence_ms >= 600
    turn_seconds = len(ended[0].audio) / 16000
    assert turn_seconds == pytest.approx(
        (ended[0].audio_end_ms - ended[0].audio_start_ms) / 1000, abs=0.15
    )


def test_a_short_pause_is_not_the_end_of_the_turn() -> None:
    first, second = librivox("0880"), goforward()[int(0.45 * 16000) :]
    audio = np.concatenate((silence(0.5), first, second, silence(1.2)))
    events = run(audio, TurnConfig(turn_silence_ms=700, early_ms=150))
    kinds = [type(e).__name__ for e in events]
    assert kinds.count("SpeechStarted") == 1
    assert kinds.count("TurnEnded") == 1
    # The pause between the clips is seen (speculation starts) and then undone.
    assert "Paused" in kinds and "Resumed" in kinds
    assert kinds.index("Resumed") < kinds.index("TurnEnded")
    ended = next(e for e in events if isinstance(e, TurnEnded))
    assert len(ended.audio) / 16000 > 4.0  # both phrases in one turn


@pytest.mark.parametrize("vad", ["webrtc", pytest.param("silero", marks=pytest.mark.models)])
@pytest.mark.parametrize("clip", ["0870", "0920"])
def test_a_400_ms_pause_mid_sentence_does_not_end_the_turn(clip: str, vad: str) -> None:
    """At the service's default turn settings. The pause falls between two
    words in the middle of the sentence ("how much | there might be",
    "a more amiable woman | he might have been")."""
    sentence = with_pause(librivox(clip), 0.4)
    audio = np.concatenate((silence(0.5), sentence, silence(1.0)))
    events = run(audio, turn_config(Settings(vad=vad)), vad)
    kinds = [type(e).__name__ for e in events]
    assert kinds.count("SpeechStarted") == 1
    assert kinds.count("TurnEnded") == 1
    # The pause was seen (the service transcribes its words early) and then undone.
    assert kinds.index("Resumed") < kinds.index("TurnEnded")
    ended = next(e for e in events if isinstance(e, TurnEnded))
    assert len(ended.audio) / 16000 > len(sentence) / 16000 - 0.3  # the whole sentence


def test_two_utterances_separated_by_silence_are_two_turns() -> None:
    audio = np.concatenate(
        (silence(0.5), librivox("0880"), silence(1.5), librivox("0930"), silence(1.5))
    )
    events = run(audio, TurnConfig(turn_silence_ms=500))
    assert [type(e).__name__ for e in events if not isinstance(e, Paused | Resumed)] == [
        "SpeechStarted",
        "TurnEnded",
        "SpeechStarted",
        "TurnEnded",
    ]


def test_pause_audio_matches_the_final_turn_when_nothing_follows() -> None:
    """The speculative transcript is reused only if it saw the whole turn."""
    audio = np.concatenate((silence(0.5), librivox("0930"), silence(1.0)))
    events = run(audio, TurnConfig(turn_silence_ms=500, early_ms=150))
    pauses = [e for e in events if isinstance(e, Paused)]
    ended = next(e for e in events if isinstance(e, TurnEnded))
    assert pauses[-1].audio_end_ms == ended.audio_end_ms
    assert np.array_equal(pauses[-1].audio, ended.audio)


@pytest.mark.parametrize("vad", ["webrtc", pytest.param("silero", marks=pytest.mark.models)])
def test_silence_and_noise_make_no_turn(vad: str) -> None:
    rng = np.random.default_rng(0)
    noise = (rng.normal(0, 30, 16000 * 3)).astype(np.int16)  # a quiet room, about -61 dBFS
    assert run(np.concatenate((silence(1.0), noise)), TurnConfig(), vad) == []


def test_silence_setting_changes_the_end_of_turn_delay() -> None:
    audio = np.concatenate((silence(0.5), librivox("0880"), silence(2.0)))
    short = next(e for e in run(audio, TurnConfig(turn_silence_ms=300)) if isinstance(e, TurnEnded))
    long = next(e for e in run(audio, TurnConfig(turn_silence_ms=1200)) if isinstance(e, TurnEnded))
    assert short.silence_ms == 300 and long.silence_ms == 1200
    assert short.audio_end_ms == long.audio_end_ms


def test_a_pause_is_offered_to_the_model_once_and_the_long_silence_still_ends_the_turn() -> None:
    speech = with_pause(librivox("0870"), 0.8)
    audio = np.concatenate((silence(0.5), speech, silence(2.5)))
    config = TurnConfig(turn_silence_ms=2000, judge_ms=200)
    events = run(audio, config)
    candidates = [e for e in events if isinstance(e, EndCandidate)]
    # The 0.8 s pause and the final silence, each offered once, at 200 ms.
    assert len(candidates) >= 2 and all(c.silence_ms == 200 for c in candidates)
    ended = [e for e in events if isinstance(e, TurnEnded)]
    assert len(ended) == 1 and ended[0].silence_ms == 2000
    # The offered audio is the turn so far with the silence heard.
    assert len(candidates[-1].audio) > len(ended[0].audio)


def turn_end_silences(
    detector: TurnDetector, audio: np.ndarray, at_candidate: Callable[[int, int], object]
) -> list[int]:
    """Feed ``audio`` through the WebRTC VAD into ``detector``; at each end
    candidate, ``at_candidate(sample offset, turns ended so far)``. The
    silence each turn ended after."""
    vad = SpeechDetector(WebRtcVad(3))
    ends: list[int] = []
    for start in range(0, len(audio) - FRAME_SAMPLES + 1, FRAME_SAMPLES):
        frame = audio[start : start + FRAME_SAMPLES]
        for event in detector.push(frame, vad.probability(frame)):
            if isinstance(event, EndCandidate):
                at_candidate(start, len(ends))
            if isinstance(event, TurnEnded):
                ends.append(event.silence_ms)
    return ends


def test_end_after_silence_ends_this_turn_sooner_and_only_this_turn() -> None:
    speech = librivox("0930")
    detector = TurnDetector(TurnConfig(turn_silence_ms=2000, judge_ms=200))
    audio = np.concatenate((speech, silence(1.0), speech, silence(2.5)))

    def as_when_the_model_fails(start: int, ended: int) -> None:
        if not ended:
            detector.end_after_silence(500)

    assert turn_end_silences(detector, audio, as_when_the_model_fails) == [500, 2000]


def test_end_after_silence_for_this_pause_only_lapses_when_the_caller_speaks_again() -> None:
    # A pause mid-sentence (0.6 s put there, with the clip's own quiet end
    # under 1.2 s), then the rest and a long silence: the shorter end set
    # at the first pause (as the words judge's split cap) must not end the
    # turn at the second.
    speech = librivox("0930")
    detector = TurnDetector(TurnConfig(turn_silence_ms=2000, judge_ms=200))
    audio = np.concatenate((speech, silence(0.6), speech, silence(2.5)))
    candidates: list[int] = []

    def at_the_first_pause(start: int, ended: int) -> None:
        candidates.append(start)
        if len(candidates) == 1:
            detector.end_after_silence(1200, this_pause=True)

    # The pause stayed under the 1.2 s it was given; the end of the
    # speech waited the full 2 s, not the lapsed 1.2 s.
    assert turn_end_silences(detector, audio, at_the_first_pause) == [2000]

    def at_the_last_pause(start: int, ended: int) -> None:
        if start > len(audio) - 3 * 16_000:
            detector.end_after_silence(1200, this_pause=True)

    # Set at the last pause instead, it ends the turn there.
    detector.reset()
    assert turn_end_silences(detector, audio, at_the_last_pause) == [1200]
