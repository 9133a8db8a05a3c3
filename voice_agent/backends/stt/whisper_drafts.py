"""Drafts for Whisper's decoder: what the same turn's audio said before.

A caller's turn is transcribed at each of its pauses (the speculation a
reply is prepared from) and again at its end, each time from the start of
the turn: the audio at one pause begins with the whole audio of the pause
before. Its transcript then mostly begins with the earlier one, so the
earlier tokens are a draft the decoder checks in one step instead of
choosing them one step each (whisper_onnx_decoder.py): a turn with a
pause inside it is transcribed 7-11 % sooner (paired median, bench/RESULTS.md;
its decoding alone, for a 7 s turn, 42 ms against 210), and a draft that is
wrong from its first token costs that one step over its positions (~1 ms a
position on 2 cores).

Kept: the last few utterances decoded in this process, whichever caller's;
a new one is matched by its audio, never by who sent it, so no session
needs to say which turn is which.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

import numpy as np

# A turn keeps one entry (its fullest transcript so far, see remember()), so
# this is the turns of callers speaking at once that keep their drafts; a
# few MB of audio at most (16 kHz int16: 32 kB a second).
KEPT = 16


class RecentTranscripts:
    """The last KEPT utterances' audio and tokens; used from the STT's
    batching threads (several with parallel batches), hence the lock."""

    def __init__(self, kept: int = KEPT) -> None:
        self._recent: deque[tuple[np.ndarray, tuple[int, ...]]] = deque(maxlen=kept)
        self._lock = threading.Lock()
        self.drafted = 0  # utterances given a draft

    def draft_for(self, audio: np.ndarray) -> tuple[int, ...]:
        """The most tokens of an utterance whose audio ``audio`` begins with
        (the same turn, heard at an earlier pause; of two alike, the later),
        or none. The most: a speculation dropped after a few tokens must not
        hide the whole transcript of the pause before it."""
        with self._lock:
            recent = list(self._recent)
        found: tuple[int, ...] = ()
        for earlier, tokens in recent:
            if _begins_with(audio, earlier) and len(tokens) >= len(found):
                found = tokens
        if found:
            with self._lock:
                self.drafted += 1
        return found

    def clear(self) -> None:
        with self._lock:
            self._recent.clear()

    def remember(self, audio: np.ndarray, tokens: Sequence[int]) -> None:
        """Kept, in place of the same turn's earlier transcripts with no more
        tokens (a partial each second would otherwise push other callers'
        turns out); an earlier one with more stays, as draft_for says."""
        if not len(audio) or not tokens:
            return
        with self._lock:
            kept = [
                (earlier, drafted)
                for earlier, drafted in self._recent
                if len(drafted) > len(tokens) or not _begins_with(audio, earlier)
            ]
            self._recent.clear()
            self._recent.extend(kept)
            self._recent.append((audio, tuple(tokens)))


def _begins_with(audio: np.ndarray, earlier: np.ndarray) -> bool:
    """Whether ``audio`` starts with the whole of ``earlier`` (the same turn)."""
    return len(earlier) <= len(audio) and np.array_equal(audio[: len(earlier)], earlier)
