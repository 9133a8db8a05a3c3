"""From a turn's audio to the words the agent answers.

The STT's fast path transcribes every pause and turn; the checks in
``stages/transcript_check.py`` say when its transcript cannot be trusted, and
that turn is decoded again the safe way (Whisper: the full 30 s window) before
it is answered. A speculation the checks distrust is not answered early; the
final transcript makes the safe decode. What is still wordless after that,
from audio the VAD called speech, is reported as unheard, so the session asks
the caller to repeat instead of staying silent.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass

import numpy as np

from voice_agent.backends.base import SttBackend
from voice_agent.backends.capabilities import (
    CarefulTranscriber,
    SpeculativeTranscriber,
    Transcription,
)
from voice_agent.stages.transcript_check import (
    MIN_SPEECH_MS,
    distrust,
    garbled,
    hallucinated,
    has_loop,
    without_loop,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Heard:
    text: str
    # False: a speculation the checks distrust, to be decoded again the safe
    # way if its pause becomes the end of the turn.
    settled: bool = True
    distrusted: str | None = None  # why the fast transcript was not trusted
    unheard: str | None = None  # speech, but no words even the safe way: why


class HearingStats:
    """This process's counts, for /v1/stats and /metrics."""

    def __init__(self) -> None:
        self.redecoded: Counter[str] = Counter()  # safe decodes, by what was distrusted
        self.unheard: Counter[str] = Counter()  # voiced turns with no words, by why
        self.loops_cut = 0  # safe decodes that still looped, cut at the loop

    def snapshot(self) -> dict[str, object]:
        return {
            "redecoded": dict(self.redecoded),
            "unheard": dict(self.unheard),
            "loops_cut": self.loops_cut,
        }


class Hearing:
    def __init__(self, stt: SttBackend, stats: HearingStats, session_id: str) -> None:
        self._stt = stt
        self._stats = stats
        self._session_id = session_id

    async def speculate(self, audio: np.ndarray, voiced_ms: int) -> Heard | None:
        """The turn so far, at a pause, at low priority; None when shed."""
        stt = self._stt
        transcription: Transcription | None
        if isinstance(stt, CarefulTranscriber):
            transcription = await stt.transcribe_detailed(audio, speculative=True)
        elif isinstance(stt, SpeculativeTranscriber):
            text = await stt.transcribe_speculative(audio)
            transcription = None if text is None else Transcription(text)
        else:
            transcription = Transcription(await stt.transcribe(audio))
        if transcription is None:
            return None
        reason = distrust(transcription, voiced_ms)
        if reason is not None and self._can_redecode(transcription):
            return Heard(transcription.text, settled=False, distrusted=reason)
        return self._settle(transcription, reason, voiced_ms)

    async def final(self, audio: np.ndarray, voiced_ms: int, early: Heard | None) -> Heard:
        """The turn's words: a settled speculation's, or else decoded now,
        and again the safe way if the fast decode is not to be trusted."""
        if early is not None and early.settled:
            return early
        stt = self._stt
        if early is not None and early.distrusted is not None:
            reason = early.distrusted
            fast_text = early.text
        else:
            if isinstance(stt, CarefulTranscriber):
                transcription = await stt.transcribe_detailed(audio)
                assert transcription is not None  # only speculative work is shed
            else:
                transcription = Transcription(await stt.transcribe(audio))
            found = distrust(transcription, voiced_ms)
            if found is None or not self._can_redecode(transcription):
                return self._settle(transcription, found, voiced_ms)
            reason, fast_text = found, transcription.text
        assert isinstance(stt, CarefulTranscriber)
        self._stats.redecoded[reason] += 1
        log.info(
            "transcript decoded again",
            extra={"session": self._session_id, "reason": reason, "fast_text": fast_text},
        )
        careful = await stt.transcribe_detailed(audio, careful=True)
        assert careful is not None
        return self._settle(careful, reason, voiced_ms)

    def _can_redecode(self, transcription: Transcription) -> bool:
        return isinstance(self._stt, CarefulTranscriber) and not transcription.careful

    def _settle(
        self, transcription: Transcription, distrusted: str | None, voiced_ms: int
    ) -> Heard:
        """The words to answer: a loop that survived the safe way is cut at
        its start, marks alone are no words; no words from speech is unheard."""
        text = transcription.text.strip()
        if hallucinated(transcription, voiced_ms):
            text = ""
        if has_loop(text):
            self._stats.loops_cut += 1
            text = without_loop(text)
        if garbled(text):
            text = ""
        if text or voiced_ms < MIN_SPEECH_MS:
            return Heard(text, distrusted=distrusted)
        unheard = distrust(Transcription("", transcription.no_speech_prob), voiced_ms) or "empty"
        self._stats.unheard[unheard] += 1
        log.warning(
            "speech heard but no words recognised",
            extra={
                "session": self._session_id,
                "reason": unheard,
                "voiced_ms": voiced_ms,
                "distrusted": distrusted,
                "careful": transcription.careful,
                "no_speech_prob": transcription.no_speech_prob,
                "avg_logprob": transcription.avg_logprob,
                "raw_text": transcription.text,
            },
        )
        return Heard("", distrusted=distrusted, unheard=unheard)
