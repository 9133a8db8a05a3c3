"""A voice session: one caller's audio in, the assistant's audio out.

Frames flow synchronously through VAD and turn detection (microseconds per
frame); everything slow (STT, LLM, TTS) runs in tasks, so ingesting audio
never waits on a model. Latency comes from overlapping work with the
end-of-turn silence: when the user pauses, their words so far are transcribed
and a reply is prepared at once; if the pause becomes the end of their turn,
that reply is already synthesised and only has to be released. If they speak
again, the speculation is dropped.

This module is the façade: what a session is built from, its construction,
and the controls that touch the whole session (settings, stats, closing).
Its steps are parts, one module each, over the state they share
(``state``): audio in (``ingest``), the model's end of turn
(``end_of_turn``), the pause's speculation (``speculation``), the ended
turn's transcript and answer (``user_turns``), replies (``replies``) and the
client's edits of the history (``conversation_items``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from voice_agent.backends.base import (
    LlmBackend,
    SttBackend,
    ToolChoice,
    ToolSpec,
    TtsBackend,
    TurnBackend,
    VadBackend,
    WordsBackend,
)
from voice_agent.backends.capabilities import PartialTranscriber
from voice_agent.backends.runtime.durations import Durations
from voice_agent.session.barge_in import BargeIn
from voice_agent.session.conversation import Conversation
from voice_agent.session.conversation_items import ConversationItems, ItemError
from voice_agent.session.end_of_turn import EndOfTurn
from voice_agent.session.endpointing import EndOfTurnJudge, JudgeStats
from voice_agent.session.events import SessionEvent
from voice_agent.session.hearing import Hearing, HearingStats
from voice_agent.session.ids import new_id
from voice_agent.session.ingest import AudioIngest
from voice_agent.session.input import ManualTurnBuffer, SemanticTurn, TurnDetection
from voice_agent.session.metrics import Verdict
from voice_agent.session.partials import PartialTranscripts
from voice_agent.session.prefill import PrefillGate, RepliesWatched, SessionPrefills
from voice_agent.session.replies import Replies, ResponseRequest
from voice_agent.session.reply import AudioOutput, Reply, ReplySettings
from voice_agent.session.speculation import Speculating, Speculation
from voice_agent.session.tools import ToolRegistry
from voice_agent.session.user_turns import UserTurns
from voice_agent.stages.turns import FRAME_MS, TurnConfig, TurnDetector
from voice_agent.stages.vad import SpeechDetector

# The transport and the protocol import these from here.
__all__ = ["ItemError", "Models", "ResponseRequest", "SessionConfig", "VoiceSession"]


@dataclass(frozen=True)
class Models:
    """Shared, process-wide model backends."""

    vad: VadBackend
    stt: SttBackend
    tts: TtsBackend
    llm: LlmBackend
    turn: TurnBackend | None = None  # the end-of-turn model; None: silence only
    words: WordsBackend | None = None  # reads a pause's words for the end of turn


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
    barge_in_onset_ms: int = 60


class VoiceSession(AudioIngest, EndOfTurn, Speculating, UserTurns, Replies, ConversationItems):
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
                models.turn,
                config.judge_stats or JudgeStats(),
                self.id,
                config.judge_timeout_s,
                models.words,
            )
        self._verdict: Verdict | None = None  # the turn in progress's last
        self._barge_in = BargeIn(
            output, config.interrupt_min_ms, self.id, config.barge_in_onset_ms // FRAME_MS
        )
        self._pending = np.zeros(0, dtype=np.int16)
        self._item_id: str | None = None  # the user turn being spoken
        self._last_voiced_at: float | None = None
        self._speculation: Speculation | None = None
        self._response: Reply | None = None  # the reply being played
        self._turn_tasks: set[asyncio.Task[None]] = set()
        self._live_responses: set[Reply] = set()
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
        self.stt_latency = Durations()  # final transcripts: request to text
        self.speculations_shed = 0  # pauses not transcribed early: finals were waiting
        self._partials: PartialTranscripts | None = None
        if partials:
            assert isinstance(models.stt, PartialTranscriber)
            on_words = self._prefill_words if prefills_words else None
            self._partials = PartialTranscripts(
                models.stt, config.partial_interval_ms, emit, self.id, on_words
            )

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
