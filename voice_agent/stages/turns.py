"""Turn detection: from per-frame speech probabilities to user turns.

Fed 20 ms frames of 16 kHz audio, it decides when the user starts speaking
(enough voiced frames in a short window), when they pause (a short silence:
the moment to transcribe speculatively), when they resume, and when their turn
ends (a long enough silence). Audio from just before the onset is kept so the
first syllable, which VADs detect late, is not lost.

With ``judge_ms`` set, a pause that lasts that long is offered to an
end-of-turn model (``EndCandidate``): the session ends the turn at once
(``end_turn``) when the model says the caller is done, and otherwise the
long silence (the cap) ends it, or a shorter one if the model could not
answer (``end_after_silence``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 16_000
FRAME_MS = 20
FRAME_SAMPLES = SAMPLE_RATE * FRAME_MS // 1000


@dataclass(frozen=True)
class TurnConfig:
    speech_start_ms: int = 100
    turn_silence_ms: int = 500
    early_ms: int = 150
    preroll_ms: int = 300
    max_turn_s: float = 30.0
    threshold: float = 0.5
    judge_ms: int = 0  # 0: no EndCandidate; the silence alone ends turns


@dataclass(frozen=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True)
class Paused:
    """The user has been quiet for ``early_ms``: their words so far are final
    unless they resume. ``audio`` is the turn up to the last voiced frame."""

    audio: np.ndarray
    audio_end_ms: int
    voiced_ms: int = 0  # how much of it the VAD called speech


@dataclass(frozen=True)
class EndCandidate:
    """The user has been quiet for ``judge_ms``: is the turn over? ``audio``
    is the turn so far, the silence heard included (an end-of-turn model
    hears how the speech stopped)."""

    audio: np.ndarray
    silence_ms: int


@dataclass(frozen=True)
class Resumed:
    pass


@dataclass(frozen=True)
class TurnEnded:
    audio: np.ndarray  # the whole turn, pre-roll included, trailing silence trimmed
    audio_start_ms: int
    audio_end_ms: int
    silence_ms: int  # silence waited after the last voiced frame
    voiced_ms: int = 0  # how much of the turn the VAD called speech


TurnEvent = SpeechStarted | Paused | EndCandidate | Resumed | TurnEnded


class TurnDetector:
    def __init__(self, config: TurnConfig) -> None:
        self.config = config
        self.threshold = config.threshold  # speech probability that counts as voiced
        self._start_frames = max(1, config.speech_start_ms // FRAME_MS)
        self._end_frames = max(1, config.turn_silence_ms // FRAME_MS)
        self._early_frames = max(1, min(config.early_ms, config.turn_silence_ms) // FRAME_MS)
        self._judge_frames = config.judge_ms // FRAME_MS  # 0: never
        self._turn_end_frames: int | None = None  # this turn only (end_after_silence)
        self._pause_end_frames: int | None = None  # this pause only (end_after_silence)
        self._max_frames = int(config.max_turn_s * 1000 / FRAME_MS)
        self._preroll: deque[np.ndarray] = deque(maxlen=max(1, config.preroll_ms // FRAME_MS))
        self._recent: deque[bool] = deque(maxlen=self._start_frames)
        self._turn: list[np.ndarray] = []
        self._in_turn = False
        self._silent_frames = 0
        self._voiced_len = 0  # frames in the turn up to the last voiced one
        self._voiced_frames = 0  # voiced frames in the turn
        self._paused = False
        self._frame_index = 0
        self._turn_start_frame = 0

    @property
    def in_turn(self) -> bool:
        return self._in_turn

    @property
    def turn_ms(self) -> int:
        """Length of the turn in progress so far (0 outside a turn)."""
        return len(self._turn) * FRAME_MS if self._in_turn else 0

    @property
    def silence_ms(self) -> int:
        """The silence since the turn in progress was last voiced."""
        return self._silent_frames * FRAME_MS if self._in_turn else 0

    @property
    def voiced_ms(self) -> int:
        """How much of the turn in progress the VAD called speech (0 outside one)."""
        return self._voiced_frames * FRAME_MS if self._in_turn else 0

    def turn_audio(self) -> np.ndarray:
        """The turn in progress so far, pre-roll included."""
        return np.concatenate(self._turn) if self._turn else np.zeros(0, dtype=np.int16)

    def set_silence_ms(self, silence_ms: int) -> None:
        self._end_frames = max(1, silence_ms // FRAME_MS)
        self._early_frames = max(1, min(self.config.early_ms, silence_ms) // FRAME_MS)

    def set_judge_ms(self, judge_ms: int) -> None:
        """Offer pauses this long to an end-of-turn model; 0: never."""
        self._judge_frames = judge_ms // FRAME_MS

    def end_after_silence(self, silence_ms: int, this_pause: bool = False) -> TurnEnded | None:
        """End the turn in progress once its silence reaches ``silence_ms``,
        whatever the set silence is: now (the turn returned) if it already
        has, as when audio came faster than real time, else at that frame.
        ``this_pause``: only if the caller stays quiet; once they speak
        again the set silence is back."""
        if not self._in_turn:
            return None
        frames = max(1, silence_ms // FRAME_MS)
        if this_pause:
            self._pause_end_frames = frames
        else:
            self._turn_end_frames = frames
        if self._silent_frames >= frames:
            return self.end_turn()
        return None

    def set_preroll_ms(self, preroll_ms: int) -> None:
        """Keep this much audio from before an onset (from the next turn on)."""
        kept = list(self._preroll)
        self._preroll = deque(kept, maxlen=max(1, preroll_ms // FRAME_MS))

    def end_turn(self) -> TurnEnded | None:
        """End the turn in progress now (the client committed it), as if its
        silence had run out; None outside a turn."""
        if not self._in_turn:
            return None
        ended = TurnEnded(
            audio=self._voiced_audio(),
            audio_start_ms=self._ms(self._turn_start_frame),
            audio_end_ms=self._end_ms(),
            silence_ms=self._silent_frames * FRAME_MS,
            voiced_ms=self._voiced_frames * FRAME_MS,
        )
        self.reset()
        return ended

    def reset(self) -> None:
        self._turn.clear()
        self._recent.clear()
        self._in_turn = False
        self._paused = False
        self._silent_frames = 0
        self._turn_end_frames = None
        self._pause_end_frames = None

    def push(self, frame: np.ndarray, probability: float) -> list[TurnEvent]:
        """One 20 ms frame and its speech probability; returns what happened."""
        voiced = probability >= self.threshold
        self._frame_index += 1
        if not self._in_turn:
            return self._push_idle(frame, voiced)
        return self._push_in_turn(frame, voiced)

    def _ms(self, frame_index: int) -> int:
        return frame_index * FRAME_MS

    def _push_idle(self, frame: np.ndarray, voiced: bool) -> list[TurnEvent]:
        self._preroll.append(frame)
        self._recent.append(voiced)
        # Onset: most of the last speech_start_ms is voiced (tolerates one gap).
        needed = max(1, self._start_frames - (1 if self._start_frames >= 4 else 0))
        if len(self._recent) < self._start_frames or sum(self._recent) < needed:
            return []
        self._in_turn = True
        self._turn_end_frames = None
        self._voiced_frames = sum(self._recent)
        self._turn = list(self._preroll)
        self._preroll.clear()
        self._recent.clear()
        self._silent_frames = 0
        self._voiced_len = len(self._turn)
        self._paused = False
        self._turn_start_frame = self._frame_index - len(self._turn)
        return [SpeechStarted(audio_start_ms=self._ms(self._turn_start_frame))]

    def _push_in_turn(self, frame: np.ndarray, voiced: bool) -> list[TurnEvent]:
        self._turn.append(frame)
        events: list[TurnEvent] = []
        if voiced:
            self._silent_frames = 0
            self._pause_end_frames = None
            self._voiced_frames += 1
            self._voiced_len = len(self._turn)
            if self._paused:
                self._paused = False
                events.append(Resumed())
        else:
            self._silent_frames += 1
        if not self._paused and self._silent_frames == self._early_frames:
            self._paused = True
            events.append(
                Paused(
                    audio=self._voiced_audio(),
                    audio_end_ms=self._end_ms(),
                    voiced_ms=self._voiced_frames * FRAME_MS,
                )
            )
        if self._judge_frames and self._silent_frames == self._judge_frames:
            events.append(EndCandidate(np.concatenate(self._turn), self._silent_frames * FRAME_MS))
        end_frames = self._end_frames
        for shorter in (self._turn_end_frames, self._pause_end_frames):
            if shorter is not None:
                end_frames = min(end_frames, shorter)
        if self._silent_frames >= end_frames or len(self._turn) >= self._max_frames:
            events.append(
                TurnEnded(
                    audio=self._voiced_audio(),
                    audio_start_ms=self._ms(self._turn_start_frame),
                    audio_end_ms=self._end_ms(),
                    silence_ms=self._silent_frames * FRAME_MS,
                    voiced_ms=self._voiced_frames * FRAME_MS,
                )
            )
            self._in_turn = False
            self._paused = False
            self._turn = []
            self._silent_frames = 0
            self._turn_end_frames = None
            self._pause_end_frames = None
        return events

    def _end_ms(self) -> int:
        return self._ms(self._turn_start_frame + self._voiced_len)

    def _voiced_audio(self) -> np.ndarray:
        # A little trailing context helps the recogniser close the last word.
        tail = min(len(self._turn), self._voiced_len + 5)
        return np.concatenate(self._turn[:tail]) if tail else np.zeros(0, dtype=np.int16)
