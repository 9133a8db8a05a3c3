"""A voice session: one caller's audio in, the assistant's audio out.

Frames flow synchronously through VAD and turn detection (microseconds per
frame); everything slow (STT, LLM, TTS) runs in tasks, so ingesting audio
never waits on a model. Latency comes from overlapping work with the
end-of-turn silence: when the user pauses, their words so far are transcribed
and a reply is prepared at once; if the pause becomes the end of their turn,
that reply is already synthesised and only has to be released. If they speak
again, the speculation is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from voice_agent.backends.base import (
    ChatMessage,
    LlmBackend,
    SttBackend,
    ToolChoice,
    ToolSpec,
    TtsBackend,
    TurnBackend,
    VadBackend,
)
from voice_agent.backends.capabilities import PartialTranscriber
from voice_agent.backends.samples import Samples
from voice_agent.session.barge_in import BargeIn, is_backchannel
from voice_agent.session.conversation import Conversation
from voice_agent.session.endpointing import EndOfTurnJudge, JudgeStats, words_unfinished
from voice_agent.session.events import (
    AssistantAudioCleared,
    SessionError,
    SessionEvent,
    UserSpeechStarted,
    UserSpeechStopped,
    UserTranscript,
    UserTranscriptFailed,
    UserTurnCommitted,
)
from voice_agent.session.hearing import Heard, Hearing, HearingStats
from voice_agent.session.ids import new_id
from voice_agent.session.input import ManualTurnBuffer, SemanticTurn, TurnDetection
from voice_agent.session.metrics import TurnEndCause, TurnMetrics, Verdict, now
from voice_agent.session.partials import PartialTranscripts
from voice_agent.session.prefill import PrefillGate, RepliesWatched, SessionPrefills
from voice_agent.session.response import AudioOutput, PieceTag, ReplySettings, Response
from voice_agent.session.tools import ToolRegistry
from voice_agent.stages.turns import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    EndCandidate,
    Paused,
    Resumed,
    SpeechStarted,
    TurnConfig,
    TurnDetector,
    TurnEnded,
)
from voice_agent.stages.vad import SpeechDetector

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Models:
    """Shared, process-wide model backends."""

    vad: VadBackend
    stt: SttBackend
    tts: TtsBackend
    llm: LlmBackend
    turn: TurnBackend | None = None  # the end-of-turn model; None: silence only


@dataclass
class SessionConfig:
    instructions: str
    history_turns: int
    turn: TurnConfig
    reply: ReplySettings
    vad_floor_dbfs: float = -50.0
    prefill: bool = False
    # Also prefill the user's words so far, from each partial transcript
    # (needs ``prefill`` and an STT with partials); the gate is shared by
    # the process's sessions and sheds these prefills under load.
    prefill_partials: bool = False
    prefill_gate: PrefillGate | None = None
    tools: ToolRegistry | None = None  # server-side tools (--tools)
    partial_interval_ms: int = 0  # live partial transcripts (0 = off)
    # The longest a turn waits for its transcript: a model or server that
    # hangs fails the turn (error, apology) instead of silencing the session.
    stt_timeout_s: float = 30.0
    # The process's counts of transcripts decoded again and turns unheard.
    hearing_stats: HearingStats | None = None
    # Said when the caller spoke but no words came out, even the safe way.
    clarification: str = "Sorry, I didn't catch that. Could you say it again?"
    # Semantic turns: the pause the end-of-turn model judges, and how long
    # its verdict may take before the fixed silence decides instead.
    judge_ms: int = 200
    judge_timeout_s: float = 0.4
    judge_stats: JudgeStats | None = None
    # The session's turn detection at start (None: the fixed silence).
    semantic: SemanticTurn | None = None
    # Speech over a reply pauses it; this much of it (or words that are not
    # a backchannel) cancels it. 0: any speech onset cancels at once.
    interrupt_min_ms: int = 500


class SttTimeout(RuntimeError):
    """The STT gave no transcript in time."""


@dataclass(frozen=True)
class ResponseRequest:
    """What a client asks of one reply (beyond answering the conversation)."""

    instructions: str | None = None
    max_output_tokens: int | None = None
    in_conversation: bool = True  # False: out of band, the history never sees it
    context: tuple[ChatMessage, ...] | None = None  # what it answers instead of the history
    metadata: Mapping[str, str] | None = None
    audio: bool | None = None  # None: as the session's replies
    tools: tuple[ToolSpec, ...] | None = None  # the client's tools for it (None: the session's)
    tool_choice: ToolChoice | None = None
    voice: str | None = None  # one of the TTS's voices (None: the session's)


class ItemError(ValueError):
    """A conversation item that cannot be changed as asked."""


def _succeeded(task: asyncio.Task[Any]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


@dataclass
class _Speculation:
    audio_end_ms: int
    stt_task: asyncio.Task[Heard | None]  # None: shed under load
    response: Response | None = None
    metrics: TurnMetrics | None = None
    complete: Verdict | None = None  # the model's "complete", waiting for these words


class VoiceSession:
    def __init__(
        self,
        models: Models,
        config: SessionConfig,
        output: AudioOutput,
        emit: Callable[[SessionEvent], None],
        session_id: str | None = None,
    ) -> None:
        self.id = session_id or new_id("sess")
        self.models = models
        self.config = config
        self.output = output
        self._emit = emit
        self.conversation = Conversation(config.instructions, config.history_turns)
        self._speech = SpeechDetector(models.vad, config.vad_floor_dbfs)
        self._detector = TurnDetector(config.turn)
        self._hearing = Hearing(models.stt, config.hearing_stats or HearingStats(), self.id)
        self._judge: EndOfTurnJudge | None = None
        if models.turn is not None and models.turn.semantic:
            self._judge = EndOfTurnJudge(
                models.turn, config.judge_stats or JudgeStats(), self.id, config.judge_timeout_s
            )
        self._verdict: Verdict | None = None  # the turn in progress's last
        self._barge_in = BargeIn(output, config.interrupt_min_ms, self.id)
        self._pending = np.zeros(0, dtype=np.int16)
        self._item_id: str | None = None  # the user turn being spoken
        self._last_voiced_at: float | None = None
        self._speculation: _Speculation | None = None
        self._response: Response | None = None  # the reply being played
        self._turn_tasks: set[asyncio.Task[None]] = set()
        self._live_responses: set[Response] = set()
        self._prefills = SessionPrefills(models.llm, self.id, config.prefill_gate)
        partials = config.partial_interval_ms > 0 and isinstance(models.stt, PartialTranscriber)
        prefills_words = partials and config.prefill and config.prefill_partials
        # With words prefills, replies are watched by the gate: none starts
        # while a reply waits for its first token.
        self._reply_llm: LlmBackend = (
            RepliesWatched(models.llm, config.prefill_gate)
            if prefills_words and config.prefill_gate is not None
            else models.llm
        )
        # A reply asked for while a committed turn was still being transcribed.
        self._deferred_reply: asyncio.Task[None] | None = None
        self._generation = 0  # bumped by every new user turn: stale work checks it
        self._closed = False
        # The server is ending the call (say_goodbye): nothing starts another reply.
        self._ending = False
        turn = config.turn
        # None: push-to-talk, turns are taken by hand (commit_input).
        self.turn_detection: TurnDetection | None = self._configure_detector(
            TurnDetection(
                turn.turn_silence_ms, turn.threshold, turn.preroll_ms, semantic=config.semantic
            )
        )
        self._manual = ManualTurnBuffer(turn.max_turn_s)
        self.audio_output = True  # False: replies are text only
        self.voice: str | None = None  # one of the TTS's voices; None: its default
        # Once the client sends its audio as data, its media track is ignored:
        # two sources would interleave their frames into one garbled stream.
        self._track_muted = False
        # Functions the client declared (session.update): it runs them itself.
        self.client_tools: list[ToolSpec] = []
        self.tool_choice: ToolChoice = "auto"
        # Typed messages (and their item ids) that arrived while a reply was being given.
        self._held_texts: list[tuple[str, str | None]] = []
        self.stt_latency = Samples()  # final transcripts: request to text
        self.speculations_shed = 0  # pauses not transcribed early: finals were waiting
        self._partials: PartialTranscripts | None = None
        if partials:
            assert isinstance(models.stt, PartialTranscriber)
            on_words = self._prefill_words if prefills_words else None
            self._partials = PartialTranscripts(
                models.stt, config.partial_interval_ms, emit, self.id, on_words
            )

    # -- audio in ------------------------------------------------------------
    def push_audio(self, samples: np.ndarray, from_track: bool = True) -> None:
        """16 kHz mono int16 audio, any length: from the media track, or sent
        by the client as data (``from_track=False``), which silences the track."""
        if self._closed or self._ending or (from_track and self._track_muted):
            return
        if not from_track and not self._track_muted:
            self._track_muted = True
            self._pending = np.zeros(0, dtype=np.int16)
        data = np.concatenate((self._pending, samples)) if self._pending.size else samples
        full = len(data) - len(data) % FRAME_SAMPLES
        detection = self.turn_detection
        for start in range(0, full, FRAME_SAMPLES):
            frame = data[start : start + FRAME_SAMPLES]
            probability = self._speech.probability(frame)
            voiced = probability >= self._detector.threshold
            if voiced:
                self._last_voiced_at = now()
                if self._judge is not None:
                    self._judge.cancel()  # the pause it judged is over
            if detection is None:
                self._manual.push(frame, voiced)
                continue
            for event in self._detector.push(frame, probability):
                self._handle(event)
            if self._detector.in_turn and self._barge_in.heard_enough(self._detector.voiced_ms):
                self._barge_in.confirm()  # long enough to be an interruption
        self._pending = data[full:]
        if detection is None:
            return
        if self._partials is not None and self._item_id is not None and self._detector.in_turn:
            self._partials.on_audio(
                self._item_id, self._detector.turn_ms, self._detector.turn_audio
            )

    def _handle(self, event: SpeechStarted | Paused | EndCandidate | Resumed | TurnEnded) -> None:
        if isinstance(event, SpeechStarted):
            self._verdict = None
            self._on_speech_started(event)
        elif isinstance(event, Paused):
            if self._partials is not None:
                self._partials.pause()
            self._start_speculation(event)
        elif isinstance(event, EndCandidate):
            self._ask_judge(event)
        elif isinstance(event, Resumed):
            self._verdict = None  # that pause's
            if self._partials is not None:
                self._partials.resume()
            self._drop_speculation()
        else:
            if self._judge is not None:
                self._judge.cancel()
            self._on_turn_ended(event, "silence")

    # -- semantic end of turn -------------------------------------------------------
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
            heard = early.result() if early is not None and _succeeded(early) else None
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

    def _on_speech_started(self, event: SpeechStarted) -> None:
        self._generation += 1
        self._item_id = new_id("item")
        self._emit(UserSpeechStarted(self._item_id, event.audio_start_ms))
        # Barge-in: the user talks over the assistant (or over a reply still
        # being prepared for their previous turn).
        if self._interrupts() and self._replying():
            assert self._response is not None
            if self.turn_detection is None or not self._barge_in.hold(
                self._response, self._generation
            ):
                self._response.cancel("turn_detected")
        self._drop_speculation()

    def _replying(self) -> bool:
        return self._response is not None and self._response.status == "in_progress"

    def _interrupts(self) -> bool:
        return self.turn_detection is None or self.turn_detection.interrupt_response

    def _answers_turns(self) -> bool:
        """Whether a turn that ends is answered now: turns are detected, with
        replies, and speaking may interrupt the reply being given if there is one."""
        detection = self.turn_detection
        if detection is None or not detection.create_response:
            return False
        return detection.interrupt_response or not self._replying()

    # -- speculation ------------------------------------------------------------
    def _start_speculation(self, event: Paused) -> None:
        self._drop_speculation()
        log.debug("speculating", extra={"session": self.id, "audio_end_ms": event.audio_end_ms})
        metrics = TurnMetrics(speculative=True, stt_start=now())
        transcript = self._hearing.speculate(event.audio, event.voiced_ms)
        task = asyncio.create_task(transcript, name="stt-early")
        spec = _Speculation(event.audio_end_ms, task, metrics=metrics)
        self._speculation = spec
        generation = self._generation
        task.add_done_callback(lambda t: self._on_early_transcript(spec, t, generation))

    def _on_early_transcript(
        self, spec: _Speculation, task: asyncio.Task[Heard | None], gen: int
    ) -> None:
        heard = task.result() if _succeeded(task) else None
        current = self._speculation is spec and gen == self._generation and not self._closed
        if heard is None and _succeeded(task):  # shed under load: the final will come
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
        if current and spec.complete is not None:
            verdict, spec.complete = spec.complete, None
            self._end_if_words_finished(verdict, heard)

    def _decide_barge_in(self, heard: Heard) -> bool:
        """Speech over a paused reply has paused: its words so far decide.
        None, or a backchannel: end that turn now (True), so the reply goes
        on soon (a cough, an "mm-hmm"). Words: the caller has the turn."""
        if is_backchannel(heard.text):
            ended = self._detector.end_turn()
            if ended is not None:
                self._on_turn_ended(ended, "barge_in")
            return True
        self._barge_in.confirm()
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

    # -- end of turn --------------------------------------------------------------
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
        spec: _Speculation | None,
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
        spec: _Speculation | None,
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
            if heard.unheard is not None or is_backchannel(heard.text):
                # A cough or an "mm-hmm" over the reply: it goes on, unanswered.
                self._emit(UserTranscript(item_id, heard.text))
                if spec is not None and spec.response is not None:
                    spec.response.cancel("superseded")
                self._barge_in.release("backchannel" if heard.text.strip() else "no words")
                return
            self._barge_in.confirm()
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
        self._play(response)

    async def _transcribe_turn(
        self, event: TurnEnded, spec: _Speculation | None, metrics: TurnMetrics
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
        spec: _Speculation | None,
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
        self._play(self._new_response(None, metrics, failure=error))

    def _transcription_failed(
        self,
        item_id: str,
        exc: Exception,
        spec: _Speculation | None,
        metrics: TurnMetrics,
        generation: int,
    ) -> None:
        """Say so, to the client and out loud: silence would leave the
        caller waiting for an answer that never comes."""
        if self._barge_in.holding(generation):
            self._barge_in.confirm()  # no words to tell: the caller spoke, they have the turn
        code = "stt_timeout" if isinstance(exc, SttTimeout) else "stt_error"
        log.warning(
            "transcription failed",
            exc_info=not isinstance(exc, SttTimeout),
            extra={"session": self.id, "code": code, "error": str(exc)},
        )
        message = f"transcription failed: {exc}"
        self._emit(UserTranscriptFailed(item_id, code, message))
        if spec is not None and spec.response is not None:
            spec.response.cancel("superseded")
        if generation != self._generation or self._closed:
            return  # the user already speaks again: that turn gets its own answer
        self._play(self._new_response(None, metrics, failure=SessionError(code, message)))

    # -- replies ------------------------------------------------------------------
    @property
    def tools(self) -> list[ToolSpec]:
        server = self.config.tools.specs if self.config.tools is not None else []
        return [*server, *self.client_tools]

    def _new_response(
        self,
        user_text: str | None,
        metrics: TurnMetrics,
        request: ResponseRequest | None = None,
        failure: SessionError | None = None,
        script: str | None = None,
    ) -> Response:
        request = request or ResponseRequest()
        reply = self.config.reply
        if request.max_output_tokens is not None:
            reply = dataclasses.replace(reply, max_tokens=request.max_output_tokens)
        if request.context is not None:
            messages = self.conversation.prompt(list(request.context), request.instructions)
        else:
            messages = self.conversation.messages_for(user_text, request.instructions)
        tools = self.tools
        if request.tools is not None:
            server = self.config.tools.specs if self.config.tools is not None else []
            tools = [*server, *request.tools]
        response = Response(
            response_id=new_id("resp"),
            item_id=new_id("item"),
            messages=messages,
            llm=self._reply_llm,
            tts=self.models.tts,
            output=self.output,
            conversation=self.conversation if request.in_conversation else None,
            emit=self._emit,
            reply=reply,
            metrics=metrics,
            on_finished=self._on_response_finished,
            tools=tools,
            tool_choice=self.tool_choice if request.tool_choice is None else request.tool_choice,
            server_tools=self.config.tools,
            failure=failure,
            audio=self.audio_output if request.audio is None else request.audio,
            metadata=request.metadata,
            script=script,
            voice=self.voice if request.voice is None else request.voice,
        )
        self._live_responses.add(response)
        self._prefills.cancel()  # the real request must not compete with a warm-up
        response.start()
        # Tracked until its tasks have stopped, not merely until it is
        # cancelled, so closing the session waits for them.
        response.closed_callbacks.append(self._live_responses.discard)
        return response

    def _play(self, response: Response) -> None:
        if self._ending and response.script is None:
            response.cancel("server_shutdown")  # a turn that ended as the call did
            return
        if self._response is not None and self._response.status == "in_progress":
            self._response.cancel("superseded")
        self._response = response
        response.commit()

    def prefill_next_turn(self) -> None:
        """Let the LLM server process the conversation so far while the user
        is still speaking. On a CPU, prompt processing costs ~10 ms a token:
        without this, every turn pays for the previous reply again (its text
        no longer matches the server's cache once cut or re-tokenised), and a
        history window that slides pays for the whole history."""
        if not self.config.prefill or self._closed or self._ending:
            return
        self._prefills.history(self.conversation.messages_for(""), self.tools)

    def _prefill_words(self, words: str) -> None:
        """A partial transcript of the turn in progress: the LLM processes
        these words now, so the reply's prompt only adds the last few. Not
        once the user has paused (the speculative reply's request follows
        and must find the server free), nor for a turn that won't be answered."""
        if self._closed or self._ending or self._item_id is None:
            return
        if self._speculation is not None or not self._answers_turns():
            return
        self._prefills.words(words, self.conversation.messages_for(words), self.tools)

    def _on_response_finished(self, response: Response) -> None:
        self._barge_in.finished(response)
        if response is self._response:
            held, self._held_texts = self._held_texts, []
            for text, item_id in held:
                self.conversation.add_user(text, item_id)
        self.prefill_next_turn()
        log.info(
            "turn finished",
            extra={
                "session": self.id,
                "response_id": response.response_id,
                "status": response.status,
                "speculative": response.metrics.speculative,
                **response.metrics.record(),
            },
        )

    def frame_sent(self, tag: Any) -> None:
        """Called by the output track for every audio frame it sends."""
        response = self._response
        if (
            isinstance(tag, PieceTag)
            and response is not None
            and tag.response_id == response.response_id
        ):
            response.frame_sent(tag)

    # -- client controls --------------------------------------------------------------
    def update(
        self,
        instructions: str | None = None,
        silence_ms: int | None = None,
        tools: list[ToolSpec] | None = None,
        tool_choice: ToolChoice | None = None,
        max_output_tokens: int | None = None,
        audio_output: bool | None = None,
        voice: str | None = None,
    ) -> None:
        if instructions is not None:
            self.conversation.instructions = instructions
            self.config.instructions = instructions
        if silence_ms is not None and self.turn_detection is not None:
            self.set_turn_detection(dataclasses.replace(self.turn_detection, silence_ms=silence_ms))
        if audio_output is not None:
            self.audio_output = audio_output
        if voice is not None:  # the replies after this one speak with it
            self.voice = voice
        if tools is not None:
            self.client_tools = tools
        if tool_choice is not None:
            self.tool_choice = tool_choice
        if max_output_tokens is not None:
            self.config.reply = dataclasses.replace(self.config.reply, max_tokens=max_output_tokens)

    def set_turn_detection(self, detection: TurnDetection | None) -> None:
        """Detect turns with these settings, or (None) take them by hand.
        Changing between the two forgets the turn in progress."""
        automatic_before = self.turn_detection is not None
        self.turn_detection = detection
        if (detection is not None) != automatic_before:
            self._abandon_turn()
        if detection is not None:
            self.turn_detection = self._configure_detector(detection)

    def _configure_detector(self, detection: TurnDetection) -> TurnDetection:
        """Set the detector for these settings; semantic ones need a model
        (without one, the fixed silence stands)."""
        if detection.semantic is not None and self._judge is None:
            detection = dataclasses.replace(detection, semantic=None)
        if self._judge is not None:
            self._judge.cancel()  # judged for the settings before
        semantic = detection.semantic
        # With a model, the turn ends when it says so; the cap is the longest wait.
        silence_ms = semantic.cap_ms if semantic is not None else detection.silence_ms
        self._detector.set_silence_ms(silence_ms)
        self._detector.set_judge_ms(self.config.judge_ms if semantic is not None else 0)
        self._silence_ms = silence_ms
        self._detector.threshold = detection.threshold
        self._detector.set_preroll_ms(detection.preroll_ms)
        return detection

    def commit_input(self) -> str | None:
        """End the user's turn now (push-to-talk, or ahead of the detector):
        it is transcribed, and answered if turns are being answered. The new
        item's id, or None when there is no turn to commit."""
        if self._closed:
            return None
        if self.turn_detection is not None:
            item_id = self._item_id
            if self._judge is not None:
                self._judge.cancel()
            ended = self._detector.end_turn()
            if ended is None or item_id is None:
                return None
            self._on_turn_ended(ended, "commit")
            return item_id
        audio = self._manual.take()
        if audio is None:
            return None
        item_id = new_id("item")
        self._emit(UserTurnCommitted(item_id))
        end_ms = len(audio) * 1000 // SAMPLE_RATE
        event = TurnEnded(
            audio=audio,
            audio_start_ms=0,
            audio_end_ms=end_ms,
            silence_ms=0,
            voiced_ms=self._manual.taken_voiced_ms,
        )
        metrics = TurnMetrics(ended_by="commit")
        metrics.turn_end = metrics.speech_end = now()
        self._start_turn(event, item_id, None, metrics, self._generation)
        return item_id

    def clear_input(self) -> None:
        """Forget the user's audio not yet committed."""
        self._manual.clear()
        self._abandon_turn()

    def _abandon_turn(self) -> None:
        self._barge_in.release("turn abandoned")  # nothing will decide it now
        if self._judge is not None:
            self._judge.cancel()
        self._verdict = None
        if self._partials is not None:
            self._partials.stop()
        self._detector.reset()
        self._drop_speculation()
        self._item_id = None
        self._pending = np.zeros(0, dtype=np.int16)

    def add_user_text(self, text: str, item_id: str | None = None) -> None:
        """A typed user message (``conversation.item.create``); no reply by
        itself. While a reply is being given it waits for that reply's own
        message, which joins the history only when the reply ends."""
        if self._replying():
            self._held_texts.append((text, item_id))
        else:
            self.conversation.add_user(text, item_id)

    def add_function_output(self, call_id: str, output: str, item_id: str | None = None) -> bool:
        """The client's result for a function call it was asked to run; False
        (nothing added) unless that call was made and is still unanswered:
        an orphan result would make every later LLM request invalid."""
        if not self.conversation.has_open_call(call_id):
            return False
        self.conversation.add(ChatMessage("tool", output, tool_call_id=call_id), item_id)
        return True

    # -- conversation items --------------------------------------------------------
    def item_message(self, item_id: str) -> ChatMessage | None:
        """The history's message for an item (a typed text still held counts)."""
        held = next((text for text, held_id in self._held_texts if held_id == item_id), None)
        if held is not None:
            return ChatMessage("user", held)
        return self.conversation.message(item_id)

    def delete_item(self, item_id: str) -> bool:
        """Take an item's words out of the history; False if it holds none."""
        held = len(self._held_texts)
        self._held_texts = [(t, i) for t, i in self._held_texts if i != item_id]
        return self.conversation.delete(item_id) or len(self._held_texts) != held

    def delete_function_call(self, call_id: str) -> bool:
        """Take a function call (and its result) out of the history."""
        return self.conversation.delete_call(call_id)

    def truncate_item(self, item_id: str, audio_end_ms: int) -> str:
        """Keep only the words of a reply heard by ``audio_end_ms`` of its
        audio; returns them ("" when the history holds none of them)."""
        spoken = self.conversation.spoken(item_id)
        if spoken is None:
            return ""
        if audio_end_ms > spoken.played_ms:
            raise ItemError(
                f"audio_end_ms {audio_end_ms} is beyond the item's audio "
                f"({spoken.played_ms} ms were played)"
            )
        kept = self.conversation.truncate(item_id, audio_end_ms)
        return kept or ""

    def create_response(self, request: ResponseRequest | None = None) -> bool:
        """Reply to the conversation as it stands (``response.create``), or
        to the context the request gives; False while a reply is being given."""
        if self._closed or self._ending or self._replying() or self._deferred_reply is not None:
            return False
        self._drop_speculation()
        transcribing = [task for task in self._turn_tasks if not task.done()]
        if transcribing:
            # A turn committed just before (push-to-talk: commit, then
            # response.create) is part of what this reply answers.
            self._deferred_reply = asyncio.create_task(
                self._reply_after(transcribing, request), name="reply-after-turn"
            )
            return True
        self._play(self._new_response(None, TurnMetrics(), request))
        return True

    async def _reply_after(
        self, turns: list[asyncio.Task[None]], request: ResponseRequest | None
    ) -> None:
        try:
            await asyncio.wait(turns)
        finally:
            if self._deferred_reply is asyncio.current_task():
                self._deferred_reply = None
        # That turn may have been answered by itself (turn detection on).
        if not self._closed and not self._replying():
            self._play(self._new_response(None, TurnMetrics(), request))

    def stt_stats(self) -> dict[str, object]:
        """Per-session STT latency, finals and (when on) partials."""
        stats: dict[str, object] = {
            "final": self.stt_latency.summary_ms(),
            "speculations_shed": self.speculations_shed,
        }
        if self._partials is not None:
            stats["partial"] = self._partials.latency.summary_ms()
        return stats

    @property
    def current_silence_ms(self) -> int:
        return self._silence_ms

    def cancel_response(self, reason: str = "client_cancelled") -> bool:
        """Cancel the reply being played (or waiting for a turn's transcript);
        False when there is none."""
        self._drop_speculation()
        if self._deferred_reply is not None:
            self._deferred_reply.cancel()
            self._deferred_reply = None
            return True
        if self._response is None or not self._replying():
            return False
        self._response.cancel(reason)
        return True

    def say_goodbye(self, text: str) -> Response:
        """The last reply of a call the server ends (a drain): the reply being
        given stops, these words are spoken (no LLM, outside the history),
        and nothing the caller says or asks starts another one. Its
        ``wait_closed`` returns once the words have been played."""
        self._ending = True
        self._drop_speculation()
        if self._deferred_reply is not None:
            self._deferred_reply.cancel()
            self._deferred_reply = None
        if self._replying():
            assert self._response is not None
            self._response.cancel("server_shutdown")
        response = self._new_response(
            None, TurnMetrics(), ResponseRequest(in_conversation=False), script=text
        )
        self._play(response)
        return response

    def clear_output(self) -> None:
        """Drop all buffered assistant audio (and the reply producing it)."""
        response = self._response
        if response is not None and response.status == "in_progress":
            response.cancel("client_cancelled")
        else:
            self.output.flush()
            if response is not None:
                self._emit(AssistantAudioCleared(response.response_id))

    async def close(self) -> None:
        """Stop everything this session started; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        if self._judge is not None:
            self._judge.cancel()
        self._drop_speculation()
        if self._partials is not None:
            self._partials.stop()
        await self._prefills.aclose()
        tasks = [*self._turn_tasks, *([self._deferred_reply] if self._deferred_reply else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        responses = list(self._live_responses)
        for response in responses:
            response.cancel("session_closed")
        for response in responses:
            await response.wait_closed()
        self._live_responses.clear()
