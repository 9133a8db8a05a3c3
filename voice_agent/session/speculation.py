"""Speculation: the reply prepared from a pause's early transcript.

When the caller pauses, their words so far are transcribed at once (at low
priority; shed under load) and, if the turn is to be answered, a reply is
generated and synthesised from them, unseen. If the pause becomes the end
of the turn, that reply only has to be released; if they speak again, it is
dropped. The early words also decide what waits on them: a burst over a
paused reply (a backchannel ends at once, words take the turn) and a
verdict that waited for them. Apart because it is the session's
one piece of work done ahead of time, with its own lifetime (a pause) and
its own way to be thrown away.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

from voice_agent.session.barge_in import is_backchannel
from voice_agent.session.hearing import Heard
from voice_agent.session.metrics import TurnMetrics, Verdict, now
from voice_agent.session.reply import Reply
from voice_agent.session.state import SessionState
from voice_agent.stages.turns import Paused

# The session's parts log as the session: one logger name to filter and set levels on.
log = logging.getLogger("voice_agent.session.session")


def succeeded(task: asyncio.Task[Any]) -> bool:
    """Whether the task ran to its end: not cancelled, no exception."""
    return task.done() and not task.cancelled() and task.exception() is None


@dataclass
class Speculation:
    """One pause's early transcript, and the reply prepared from it."""

    audio_end_ms: int
    stt_task: asyncio.Task[Heard | None]  # None: shed under load
    response: Reply | None = None
    metrics: TurnMetrics | None = None
    verdict: Verdict | None = None  # the model's verdict, waiting for these words


class Speculating(SessionState):
    """Starts, decides on and drops the pause's speculation."""

    def _start_speculation(self, event: Paused) -> None:
        self._drop_speculation()
        log.debug("speculating", extra={"session": self.id, "audio_end_ms": event.audio_end_ms})
        metrics = TurnMetrics(speculative=True, stt_start=now())
        transcript = self._hearing.speculate(event.audio, event.voiced_ms)
        task = asyncio.create_task(transcript, name="stt-early")
        spec = Speculation(event.audio_end_ms, task, metrics=metrics)
        self._speculation = spec
        generation = self._generation
        task.add_done_callback(lambda t: self._on_early_transcript(spec, t, generation))

    def _on_early_transcript(
        self, spec: Speculation, task: asyncio.Task[Heard | None], gen: int
    ) -> None:
        heard = task.result() if succeeded(task) else None
        current = self._speculation is spec and gen == self._generation and not self._closed
        if heard is None and succeeded(task):  # shed under load: the final will come
            self.speculations_shed += 1
        elif heard is not None:
            assert spec.metrics is not None
            spec.metrics.stt_done = now()
        if heard is not None and current:
            if self._barge_in.holding(gen) and self._decide_barge_in(heard):
                return
            # A transcript the checks distrust is decoded again before it is answered.
            if heard.settled and heard.text and self._answers_turns():
                assert spec.metrics is not None
                spec.response = self._new_response(heard.text, spec.metrics)
        if current and spec.verdict is not None:
            verdict, spec.verdict = spec.verdict, None
            self._apply_with_words(verdict, heard)

    def _decide_barge_in(self, heard: Heard) -> bool:
        """Speech over a paused reply has paused: its words so far decide.
        None, or a backchannel, or heard only where the reply's own echo
        could be: end that turn now (True), so the reply goes on soon (a
        cough, an "mm-hmm", an echo). Words: the caller has the turn."""
        if is_backchannel(heard.text) or self._barge_in.own_echo():
            ended = self._detector.end_turn()
            if ended is not None:
                self._on_turn_ended(ended, "barge_in")
            return True
        self._barge_in.confirm("words at the first pause")
        return False

    def _drop_speculation(self) -> None:
        spec, self._speculation = self._speculation, None
        if spec is None:
            return
        log.debug(
            "speculation dropped",
            extra={
                "session": self.id,
                "stt_done": spec.stt_task.done(),
                "had_response": spec.response is not None,
            },
        )
        spec.stt_task.cancel()
        if spec.response is not None:
            spec.response.cancel("superseded")
