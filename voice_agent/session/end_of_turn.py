"""The model's end of turn, as the session acts on it.

At a pause long enough to judge (an end candidate) the end-of-turn model
(``endpointing``) is asked whether the caller is done; its verdict counts
only for the pause it judged. "complete" ends the turn once the pause's
early transcript is in, unless the words dangle ("my number is"): then it
becomes "unfinished". No verdict leaves the turn to the fixed silence;
"incomplete" and "unfinished" let it go on, to the silence cap or the
caller's next pause. Apart because it is the one place the session decides
*when* a turn ends on a model's word; the model and its dangling-word rule
live in ``endpointing``.
"""

from __future__ import annotations

import dataclasses
import logging

from voice_agent.session.endpointing import words_unfinished
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

    def _judged(self, verdict: Verdict, generation: int) -> None:
        """The model's verdict, applied only to the pause it judged: not
        once the caller has spoken again, the turn has ended, or the
        session no longer takes semantic turns."""
        detection = self.turn_detection
        if (
            self._closed
            or generation != self._generation
            or not self._detector.in_turn
            or self._detector.silence_ms < verdict.silence_ms
            or detection is None
            or detection.semantic is None
        ):
            return
        self._verdict = verdict
        if verdict.decision == "complete":
            spec = self._speculation
            if spec is not None and not spec.stt_task.done():
                spec.complete = verdict  # the words decide when they come
                return
            early = spec.stt_task if spec is not None else None
            heard = early.result() if early is not None and succeeded(early) else None
            self._end_if_words_finished(verdict, heard)
        elif verdict.decision != "incomplete":
            # No verdict: the fixed silence ends this turn, as without a model.
            ended = self._detector.end_after_silence(detection.silence_ms)
            if ended is not None:
                self._on_turn_ended(ended, "silence")

    def _end_if_words_finished(self, verdict: Verdict, heard: Heard | None) -> None:
        """The model's "complete", unless the pause's words end on one that
        no sentence ends on: then the turn goes on (to the cap, or the next
        pause). No words to check (shed, failed): the model decides."""
        detection = self.turn_detection
        if detection is None or detection.semantic is None:
            return  # the settings changed while the words came: the silence decides
        if heard is not None and words_unfinished(heard.text):
            assert self._judge is not None
            self._judge.overruled()
            self._verdict = dataclasses.replace(verdict, decision="unfinished")
            log.debug("end of turn overruled by the words", extra={"session": self.id})
            return
        ended = self._detector.end_turn()
        if ended is not None:
            self._on_turn_ended(ended, "model")
