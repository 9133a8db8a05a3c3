"""A user turn that has ended: its transcript, then its answer.

The turn's end is told to the client at once; then, in a task of its own,
the turn's words are taken from the pause's early transcript when it can be
trusted (else the whole turn is transcribed, within ``stt_timeout_s``), a
burst over a paused reply is judged (a backchannel is not answered), and
the words join the history and are answered: by the speculative reply when
there is one, else by a new one. Speech with no words, or a transcription
that fails, is said out loud rather than left unanswered. Apart because it
is the slow half of a turn (it waits on the STT) and the part that decides
whether and how a finished turn is answered.
"""

from __future__ import annotations

import asyncio
import logging

from voice_agent.backends.base import BackendError, public_message
from voice_agent.session.barge_in import is_backchannel
from voice_agent.session.events import (
    SessionError,
    UserSpeechStopped,
    UserTranscript,
    UserTranscriptFailed,
    UserTurnCommitted,
)
from voice_agent.session.hearing import Heard
from voice_agent.session.ids import new_id
from voice_agent.session.metrics import TurnEndCause, TurnMetrics, now
from voice_agent.session.speculation import Speculation
from voice_agent.session.state import SessionState
from voice_agent.stages.turns import TurnEnded

# The session's parts log as the session: one logger name to filter and set levels on.
log = logging.getLogger("voice_agent.session.session")


class SttTimeout(BackendError):
    """The STT gave no transcript in time."""


class UserTurns(SessionState):
    """Takes an ended turn to its transcript and its answer."""

    def _on_turn_ended(self, event: TurnEnded, ended_by: TurnEndCause) -> None:
        if self._partials is not None:
            self._partials.stop()  # no delta may follow the completed transcript
        item_id = self._item_id or new_id("item")
        self._item_id = None
        self._emit(UserSpeechStopped(item_id, event.audio_end_ms))
        self._emit(UserTurnCommitted(item_id))
        spec, self._speculation = self._speculation, None
        if spec is not None and spec.audio_end_ms != event.audio_end_ms:
            self._speculation = spec
            self._drop_speculation()
            spec = None
        metrics = spec.metrics if spec is not None and spec.metrics else TurnMetrics()
        metrics.turn_end = now()
        metrics.end_of_turn = self._verdict
        metrics.ended_by = ended_by
        self._verdict = None
        metrics.speech_end = (
            metrics.turn_end - event.silence_ms / 1000.0
            if self._last_voiced_at is None
            else min(self._last_voiced_at, metrics.turn_end)
        )
        self._start_turn(event, item_id, spec, metrics, self._generation)

    def _start_turn(
        self,
        event: TurnEnded,
        item_id: str,
        spec: Speculation | None,
        metrics: TurnMetrics,
        generation: int,
    ) -> None:
        task = asyncio.create_task(
            self._finish_turn(event, item_id, spec, metrics, generation),
            name=f"turn-{item_id}",
        )
        self._turn_tasks.add(task)
        task.add_done_callback(self._turn_done)

    def _turn_done(self, task: asyncio.Task[None]) -> None:
        self._turn_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("turn handling failed", exc_info=task.exception(), extra={"session": self.id})

    async def _finish_turn(
        self,
        event: TurnEnded,
        item_id: str,
        spec: Speculation | None,
        metrics: TurnMetrics,
        generation: int,
    ) -> None:
        try:
            heard = await self._transcribe_turn(event, spec, metrics)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._transcription_failed(item_id, exc, spec, metrics, generation)
            return
        if metrics.stt_start is not None and metrics.stt_done is not None:
            self.stt_latency.add(metrics.stt_done - metrics.stt_start)
        if self._barge_in.holding(generation):
            own_echo = self._barge_in.own_echo()
            if heard.unheard is not None or is_backchannel(heard.text) or own_echo:
                # A cough, an "mm-hmm" or the reply's own echo: it goes on, unanswered.
                self._emit(UserTranscript(item_id, heard.text))
                if spec is not None and spec.response is not None:
                    spec.response.cancel("superseded")
                words = "backchannel" if heard.text.strip() else "no words"
                self._barge_in.release("own echo" if own_echo else words)
                return
            self._barge_in.confirm("words at the turn's end")
        if heard.unheard is not None:
            self._turn_unheard(item_id, heard.unheard, spec, metrics, generation)
            return
        text = heard.text
        self._emit(UserTranscript(item_id, text))
        answer = self._answers_turns()
        if text and answer:
            self.conversation.add_user(text, item_id)
        elif text:
            # Not answered now: heard over a reply, it joins the history after that reply.
            self.add_user_text(text, item_id)
        response = spec.response if spec is not None else None
        stale = generation != self._generation or self._closed
        if not text or stale or not answer:
            # Nothing was said, the user has already started another turn, or
            # this turn is not to be answered (by settings, or over a reply).
            if response is not None:
                response.cancel("superseded")
            return
        if response is None:  # the words are in the history now: not sent twice
            response = self._new_response(None, metrics)
        self._commit_reply(response)

    async def _transcribe_turn(
        self, event: TurnEnded, spec: Speculation | None, metrics: TurnMetrics
    ) -> Heard:
        """The turn's words: the early transcript if there is one it can
        trust, else the whole turn's, within ``stt_timeout_s`` of the end of
        the turn. A timeout cancels the request: still queued, it never
        reaches the model; in flight, its result is dropped."""
        timeout_s = self.config.stt_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                early = await spec.stt_task if spec is not None else None
                if early is None and not event.audio.size:
                    return Heard("")  # a turn taken by hand in which the VAD heard no speech
                if early is not None and early.settled:  # counted there, not decoded again
                    return await self._hearing.final(event.audio, event.voiced_ms, early)
                # No speculation, it was shed under load, or it is distrusted.
                metrics.speculative = False
                metrics.stt_start, metrics.stt_done = now(), None
                heard = await self._hearing.final(event.audio, event.voiced_ms, early)
                metrics.stt_done = now()
                return heard
        except TimeoutError:
            raise SttTimeout(f"no transcript within {timeout_s:g} s") from None

    def _turn_unheard(
        self,
        item_id: str,
        reason: str,
        spec: Speculation | None,
        metrics: TurnMetrics,
        generation: int,
    ) -> None:
        """The caller spoke and no words came out: say so to the client and
        ask the caller to repeat, rather than leave them waiting."""
        message = f"speech was heard but no words were recognised ({reason})"
        self._emit(UserTranscriptFailed(item_id, "speech_not_recognized", message))
        if spec is not None and spec.response is not None:
            spec.response.cancel("superseded")
        if generation != self._generation or self._closed or not self._answers_turns():
            return
        error = SessionError("speech_not_recognized", message, spoken=self.config.clarification)
        self._commit_reply(self._new_response(None, metrics, failure=error))

    def _transcription_failed(
        self,
        item_id: str,
        exc: Exception,
        spec: Speculation | None,
        metrics: TurnMetrics,
        generation: int,
    ) -> None:
        """Say so, to the client and out loud: silence would leave the
        caller waiting for an answer that never comes."""
        if self._barge_in.holding(generation):
            # No words to tell: the caller spoke, they have the turn.
            self._barge_in.confirm("not transcribed")
        code = "stt_timeout" if isinstance(exc, SttTimeout) else "stt_error"
        log.warning(
            "transcription failed",
            exc_info=not isinstance(exc, SttTimeout),
            extra={"session": self.id, "code": code, "error": str(exc)},
        )
        # The whole error is logged above; the caller gets its public part.
        message = f"transcription failed: {public_message(exc)}"
        self._emit(UserTranscriptFailed(item_id, code, message))
        if spec is not None and spec.response is not None:
            spec.response.cancel("superseded")
        if generation != self._generation or self._closed:
            return  # the user already speaks again: that turn gets its own answer
        self._commit_reply(self._new_response(None, metrics, failure=SessionError(code, message)))
