"""How a session's user turns are taken: automatically (turn detection) or
by hand (push-to-talk: the client says when the turn is complete).

By hand, the audio since the last commit is kept, with the VAD's verdict per
frame, so that a commit transcribes the speech in it and not the silence
around it (whisper-style models make words up from long silences).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from voice_agent.stages.turns import FRAME_MS

MIN_COMMIT_MS = 100  # as OpenAI's API: a shorter buffer is refused
# Around the speech of a manual turn: a little before it (onsets are detected
# late) and after it (the recogniser needs context to close the last word).
_LEAD_FRAMES = 15
_TAIL_FRAMES = 5


@dataclass(frozen=True)
class SemanticTurn:
    """An end-of-turn model judges each pause: at ``threshold`` or above
    the turn ends at once; below it, the turn ends after ``cap_ms`` of
    silence unless the caller goes on. Where the words read (a language
    model's probability of a sentence ending there) disagree with the
    voice, the pause ends the turn after ``split_cap_ms``."""

    threshold: float
    cap_ms: int
    split_cap_ms: int


@dataclass(frozen=True)
class TurnDetection:
    """Automatic turns. None in their place means turns are taken by hand."""

    silence_ms: int
    threshold: float
    preroll_ms: int
    create_response: bool = True  # answer a turn when it ends
    interrupt_response: bool = True  # speech cancels the reply being given
    # None: the silence alone ends turns. With a model, silence_ms is what
    # ends a turn when the model cannot answer in time.
    semantic: SemanticTurn | None = None


class ManualTurnBuffer:
    """The audio of a turn taken by hand, the newest ``max_s`` of it."""

    def __init__(self, max_s: float) -> None:
        self._frames: deque[tuple[np.ndarray, bool]] = deque(
            maxlen=max(1, int(max_s * 1000 / FRAME_MS))
        )

    taken_voiced_ms = 0  # how much of the last audio taken the VAD called speech

    def push(self, frame: np.ndarray, voiced: bool) -> None:
        self._frames.append((frame, voiced))

    @property
    def duration_ms(self) -> int:
        return len(self._frames) * FRAME_MS

    def clear(self) -> None:
        self._frames.clear()

    def take(self) -> np.ndarray | None:
        """The speech in the buffer, which is emptied; an empty array when
        none of it was voiced, None when it held under ``MIN_COMMIT_MS``."""
        frames = list(self._frames)
        self._frames.clear()
        if len(frames) * FRAME_MS < MIN_COMMIT_MS:
            return None
        voiced = [index for index, (_, is_voiced) in enumerate(frames) if is_voiced]
        self.taken_voiced_ms = len(voiced) * FRAME_MS
        if not voiced:
            return np.zeros(0, dtype=np.int16)
        start = max(0, voiced[0] - _LEAD_FRAMES)
        end = min(len(frames), voiced[-1] + 1 + _TAIL_FRAMES)
        return np.concatenate([frame for frame, _ in frames[start:end]])
