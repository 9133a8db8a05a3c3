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

import asyncio
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
    loop_cut: bool = False  # a loop that survived the safe way was cut
    # For the log of an unheard turn: voiced ms, no-speech, mean log-prob.
    evidence: tuple[int, float | None, float | None] | None = None


class HearingStats:
    """This process's counts, for /v1/stats and /metrics."""

    def __init__(self) -> None:
        self.redecoded: Counter[str] = Counter()  # safe decodes, by what was distrusted
        self.unheard: Counter[str] = Counter()  # voiced turns with no words, by why
        self.loops_cut = 0  # transcripts that still looped, cut where the loop starts

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
        # One turn's decode at a time per session: the STT is shared by
        # every call, so a client committing turn after turn would
        # otherwise queue decodes ahead of everyone else's.
        self._final_decode = asyncio.Lock()

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
            # Not answered from, but read at the pause: a loop is cut where
            # it starts again, so "... to be, please enter the number to be"
            # still ends where the caller stopped.
            text = transcription.text.strip()
            text = without_loop(text) if has_loop(text) else text
            return Heard(text, settled=False, distrusted=reason)
        return self._settle(transcription, reason, voiced_ms)

    async def final(self, audio: np.ndarray, voiced_ms: int, early: Heard | None) -> Heard:
        """The turn's words: a settled speculation's, or else decoded now,
        and again the safe way if the fast decode is not to be trusted."""
        if early is not None and early.settled:
            return self._counted(early)
        async with self._final_decode:
            return await self._decode_final(audio, voiced_ms, early)

    async def _decode_final(self, audio: np.ndarray, voiced_ms: int, early: Heard | None) -> Heard:
        stt = self._stt
        if early is not None and early.distrusted is not None:
            reason, fast = early.distrusted, Transcription(early.text)
        else:
            if isinstance(stt, CarefulTranscriber):
                detailed = await stt.transcribe_detailed(audio)
                assert detailed is not None  # only speculative work is shed
                fast = detailed
            else:
                fast = Transcription(await stt.transcribe(audio))
            found = distrust(fast, voiced_ms)
            if found is None or not self._can_redecode(fast):
                return self._counted(self._settle(fast, found, voiced_ms))
            reason = found
        assert isinstance(stt, CarefulTranscriber)
        self._stats.redecoded[reason] += 1
        log.info(
            "transcript decoded again",
            extra={"session": self._session_id, "reason": reason, "fast_chars": len(fast.text)},
        )
        try:
            careful = await stt.transcribe_detailed(audio, careful=True)
        except Exception as exc:
            # The fast words are better than none: the turn is answered.
            log.warning(
                "safe decode failed; the fast transcript stands",
                extra={"session": self._session_id, "error": str(exc)},
            )
            return self._counted(self._settle(fast, reason, voiced_ms))
        assert careful is not None
        return self._counted(self._settle(careful, reason, voiced_ms))

    def _can_redecode(self, transcription: Transcription) -> bool:
        return isinstance(self._stt, CarefulTranscriber) and not transcription.careful

    @staticmethod
    def _settle(transcription: Transcription, distrusted: str | None, voiced_ms: int) -> Heard:
        """The words to answer: none the model believes nobody said from a
        mere noise, a loop that survived the safe way cut where it starts
        again, marks alone no words; no words from speech is unheard."""
        text = transcription.text.strip()
        if hallucinated(transcription, voiced_ms):
            text = ""
        cut = without_loop(text) if has_loop(text) else text
        if garbled(cut):
            cut = ""
        if cut or voiced_ms < MIN_SPEECH_MS:
            return Heard(cut, distrusted=distrusted, loop_cut=cut != text)
        unheard = distrust(Transcription("", transcription.no_speech_prob), voiced_ms) or "empty"
        return Heard(
            "",
            distrusted=distrusted,
            unheard=unheard,
            evidence=(voiced_ms, transcription.no_speech_prob, transcription.avg_logprob),
        )

    def _counted(self, heard: Heard) -> Heard:
        """Counts the turn's outcome: only a final is counted, never a
        speculation its caller may yet speak on from."""
        if heard.loop_cut:
            self._stats.loops_cut += 1
        if heard.unheard is not None:
            self._stats.unheard[heard.unheard] += 1
            voiced_ms, no_speech_prob, avg_logprob = heard.evidence or (0, None, None)
            log.warning(
                "speech heard but no words recognised",
                extra={
                    "session": self._session_id,
                    "reason": heard.unheard,
                    "distrusted": heard.distrusted,
                    "voiced_ms": voiced_ms,
                    "no_speech_prob": no_speech_prob,
                    "avg_logprob": avg_logprob,
                },
            )
        return heard
