"""The model's end of turn, as the session acts on it.

At a pause long enough to judge (an end candidate) the end-of-turn model
(``endpointing``) is asked whether the caller is done; its verdict counts
only for the pause it judged. "complete" ends the turn once the pause's
early transcript is in, unless the words dangle ("my number is"): then it
becomes "unfinished". No verdict leaves the turn to the fixed silence;
"incomplete" and "unfinished" let it go on, to the silence cap or the
caller's next pause. With a words judge (a language model reading the
early transcript), the voice and the words can disagree, and then the
pause ends the turn after the split cap: an "incomplete"
whose words read as a whole sentence (a reader whose voice stayed up at
its end is answered sooner than the cap), and an unsure "complete" whose
words read as no sentence's end (a voice that fell on "letters of your
party's" is not answered at once).
Apart because it is the one place the session decides *when* a turn ends
on a model's word; the model and its dangling-word rule live in
``endpointing``.
"""

from __future__ import annotations

import dataclasses
import logging

from voice_agent.session.endpointing import (
    COMPLETE_WORDS_TIMEOUT_S,
    VOICE_SURE,
    WORDS_LIKELY,
    WORDS_UNLIKELY,
    words_unfinished,
)
from voice_agent.session.hearing import Heard
from voice_agent.session.metrics import Verdict
from voice_agent.session.speculation import succeeded
from voice_agent.session.state import SessionState
from voice_agent.stages.turns import EndCandidate

# The session's parts log as the session: one logger name to filter and set levels on.
log = logging.getLogger("voice_agent.session.session")


class EndOfTurn(SessionState):
    """Asks the end-of-turn model at a pause and applies its verdict."""

    def _ask_judge(self, event: EndCandidate) -> None:
        detection = self.turn_detection
        if self._judge is None or detection is None or detection.semantic is None:
            return
        generation = self._generation
        self._judge.judge(event, detection.semantic, lambda v: self._judged(v, generation))

    def _still_judging(self, verdict: Verdict, generation: int) -> bool:
        """Whether a verdict still applies: the caller has not spoken again,
        the turn goes on, and the session still takes semantic turns."""
        detection = self.turn_detection
        return not (
            self._closed
            or generation != self._generation
            or not self._detector.in_turn
            or self._detector.silence_ms < verdict.silence_ms
            or detection is None
            or detection.semantic is None
        )

    def _judged(self, verdict: Verdict, generation: int) -> None:
        """The model's verdict, applied only to the pause it judged."""
        if not self._still_judging(verdict, generation):
            return
        self._verdict = verdict
        if verdict.decision in ("complete", "incomplete"):
            spec = self._speculation
            if spec is not None and not spec.stt_task.done():
                spec.verdict = verdict  # the words decide when they come
                return
            early = spec.stt_task if spec is not None else None
            heard = early.result() if early is not None and succeeded(early) else None
            self._apply_with_words(verdict, heard)
            return
        # No verdict: the fixed silence ends this turn, as without a model.
        detection = self.turn_detection
        assert detection is not None
        ended = self._detector.end_after_silence(detection.silence_ms)
        if ended is not None:
            self._on_turn_ended(ended, "silence")

    def _apply_with_words(self, verdict: Verdict, heard: Heard | None) -> None:
        """The model's verdict with the pause's words. A "complete" whose
        words end on one no sentence ends on becomes "unfinished" (the turn
        goes on to the cap, or the next pause); otherwise it ends the turn,
        unless the model was unsure (under VOICE_SURE) and the words judge
        reads no sentence's end there: then the split cap. An "incomplete"
        is read by the words judge, if there is one: words that read as a
        whole sentence end the turn after the split cap rather than the
        cap. No words to check (shed, failed): the model decides."""
        detection = self.turn_detection
        if detection is None or detection.semantic is None:
            return  # the settings changed while the words came: the silence decides
        assert self._judge is not None
        # Only words the checks trust (not Whisper's "Thank you." on a breath).
        words = heard.text if heard is not None and heard.settled else ""
        generation = self._generation
        if verdict.decision == "complete":
            if heard is not None and words_unfinished(heard.text):
                self._judge.overruled()
                self._verdict = dataclasses.replace(verdict, decision="unfinished")
                log.debug("end of turn overruled by the words", extra={"session": self.id})
                return
            unsure = verdict.probability is not None and verdict.probability < VOICE_SURE
            if self._judge.words_quick and words.strip() and unsure:
                self._judge.read_words(
                    words,
                    lambda p: self._complete_read(verdict, p, generation),
                    COMPLETE_WORDS_TIMEOUT_S,
                )
                return
            self._end_now()
            return
        # Not dangling words ("my number is"): the caller goes on.
        if self._judge.words is not None and words.strip() and not words_unfinished(words):
            self._judge.read_words(words, lambda p: self._words_read(verdict, p, generation))

    def _complete_read(self, verdict: Verdict, probability: float | None, generation: int) -> None:
        """An unsure "complete", its words read: they end the turn now,
        unless no sentence ends there; then the voice and the words
        disagree, and the pause ends the turn after the split cap."""
        if not self._still_judging(verdict, generation):
            return
        assert self._judge is not None
        self._verdict = dataclasses.replace(verdict, words_probability=probability)
        if probability is None or probability >= WORDS_UNLIKELY:
            self._end_now()  # no answer, or the words may end there: the voice decides
            return
        self._judge.overruled()
        self._verdict = dataclasses.replace(self._verdict, decision="unfinished")
        self._split_cap("words_held", verdict.probability, probability)

    def _words_read(self, verdict: Verdict, probability: float | None, generation: int) -> None:
        """The voice heard the caller going on, the words read as a whole
        sentence: the pause ends the turn after the shorter split cap."""
        if not self._still_judging(verdict, generation):
            return
        self._verdict = dataclasses.replace(verdict, words_probability=probability)
        if probability is None or probability < WORDS_LIKELY:
            return  # no answer, or both say the caller goes on: the cap
        self._split_cap("words_hastened", verdict.probability, probability)

    def _split_cap(self, outcome: str, voice: float | None, words: float) -> None:
        """The voice and the words disagree: this pause ends the turn after
        the split cap (at once if it is already that long)."""
        detection = self.turn_detection
        assert detection is not None and detection.semantic is not None
        assert self._judge is not None
        self._judge.count(outcome)
        log.debug(
            "voice and words disagree: the split cap ends this pause",
            extra={"session": self.id, "outcome": outcome, "voice": voice, "words": words},
        )
        ended = self._detector.end_after_silence(detection.semantic.split_cap_ms, this_pause=True)
        if ended is not None:
            self._on_turn_ended(ended, "silence")

    def _end_now(self) -> None:
        ended = self._detector.end_turn()
        if ended is not None:
            self._on_turn_ended(ended, "model")
