"""One assistant reply: LLM stream -> clause pieces -> TTS -> audio output.

Generation and playback are two tasks joined by a small bounded queue of
audio chunks, so synthesis runs at most a few chunks ahead of what is being
played, and a streaming TTS's first chunk is played while it makes the next. A reply
can be prepared speculatively (while the user is pausing) and only starts
playing, and only becomes visible to the client, once it is committed.

Cancellation is synchronous: both tasks are cancelled and the output flushed
in one step, so not one more frame of this reply reaches the wire.

A reply that fails (the LLM unreachable or dying mid-stream, a TTS piece
that cannot be synthesised, the user's words that could not be transcribed)
still ends: what was already synthesised is played, then the apology (best
effort: the TTS may be what failed), then an ``error`` and a ``failed``
``response.done`` with the reason.

This module is the response itself: its lifecycle, its two tasks and its
end. Its LLM rounds, with the tool calls between them and what the history
keeps of them, are in ``tool_rounds``; the synthesis of its pieces into
audio chunks in ``reply_speech``; what of it the caller heard in
``reply_pieces``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from voice_agent.audio.resample import StreamResampler
from voice_agent.backends.base import (
    ChatMessage,
    LlmBackend,
    LlmError,
    ToolChoice,
    ToolSpec,
    TtsBackend,
    public_message,
)
from voice_agent.session.conversation import Conversation
from voice_agent.session.events import (
    AssistantAudioCleared,
    AssistantAudioStarted,
    AssistantAudioStopped,
    AssistantTextDelta,
    FunctionCallRequested,
    ResponseFinished,
    ResponseStarted,
    SessionError,
    SessionEvent,
)
from voice_agent.session.metrics import TurnMetrics, now
from voice_agent.session.reply_pieces import ReplyPieces
from voice_agent.session.reply_speech import LEAD_THRESHOLD, Chunk, ReplySpeech, SynthesisError
from voice_agent.session.tool_rounds import ToolRounds
from voice_agent.session.tools import ToolRegistry

# What the session, the transport and the tests import from here.
__all__ = [
    "LEAD_THRESHOLD",
    "OUTPUT_FRAME_SAMPLES",
    "AudioOutput",
    "PieceTag",
    "Reply",
    "ReplySettings",
]

log = logging.getLogger(__name__)

OUTPUT_RATE = 48_000
OUTPUT_FRAME_SAMPLES = 960
CHUNKS_AHEAD = 3


class AudioOutput(Protocol):
    """Where replies are played (the paced outbound track)."""

    async def write(self, samples: np.ndarray, tag: Any = None) -> None: ...

    async def finish(self) -> None: ...

    async def drain(self) -> None: ...

    def flush(self) -> None: ...

    def pause(self) -> None:
        """Play silence, keeping the queued audio (a caller may be interrupting)."""
        ...

    def resume(self) -> None:
        """Play the queued audio again from where it stopped."""
        ...


@dataclass(frozen=True)
class PieceTag:
    response_id: str
    index: int


@dataclass
class ReplySettings:
    max_tokens: int
    temperature: float
    # LLM rounds in one reply: each round after the first follows tool results.
    max_tool_steps: int = 3
    # Spoken when the LLM fails before saying anything, instead of silence.
    apology: str = "Sorry, I can't answer right now. Please try again in a moment."
    # Start a reply at its first audible sound (the voice's lead-in cut).
    trim_lead: bool = True


Status = Literal["in_progress", "completed", "cancelled", "failed"]


@dataclass(eq=False)
class Reply(ToolRounds, ReplySpeech):
    response_id: str
    item_id: str
    messages: list[ChatMessage]
    llm: LlmBackend
    tts: TtsBackend
    output: AudioOutput
    # None: an out-of-band reply, which never joins the history.
    conversation: Conversation | None
    emit: Callable[[SessionEvent], None]
    reply: ReplySettings
    metrics: TurnMetrics = field(default_factory=TurnMetrics)
    status: Status = "in_progress"
    on_finished: Callable[[Reply], None] | None = None
    tools: Sequence[ToolSpec] = ()
    tool_choice: ToolChoice = "auto"
    server_tools: ToolRegistry | None = None
    # Set when there is nothing to ask the LLM (the user's words could not be
    # transcribed): the reply is the apology, and it fails with this error.
    failure: SessionError | None = None
    audio: bool = True  # False: text only, no speech synthesised or played
    metadata: Mapping[str, str] | None = None  # the client's labels, told with the reply
    voice: str | None = None  # one of the TTS's voices; None: its default
    # Words to say instead of asking the LLM (the goodbye of a call the server ends).
    script: str | None = None

    def __post_init__(self) -> None:
        self._committed = asyncio.Event()
        self._queue: asyncio.Queue[Chunk | FunctionCallRequested | None] = asyncio.Queue(
            maxsize=CHUNKS_AHEAD
        )
        self._pieces = ReplyPieces(self.audio)
        self._resampler = StreamResampler(self.tts.sample_rate, OUTPUT_RATE)
        self._audio_started = False
        self._error: str | None = None
        self._error_code = "llm_error"
        self._final_text = ""  # what the model generated in its last round
        self._next_index = 0  # of the next piece
        # Tool-call messages with the results of the calls that ran, for the
        # history; pieces before ``_covered_pieces`` spoke text that is inside them.
        self._exchange: list[ChatMessage] = []
        self._covered_pieces = 0
        # The last round's client calls, recorded once handed to the client:
        # (the whole exchange, the part of it that ran on the server, its piece boundary).
        self._client_round: tuple[list[ChatMessage], list[ChatMessage], int] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # Called once both of its tasks have stopped.
        self.closed_callbacks: list[Callable[[Reply], None]] = []
        self._closed_reported = False

    # -- lifecycle -------------------------------------------------------
    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._generate(), name=f"{self.response_id}-generate"),
            asyncio.create_task(self._play_once_committed(), name=f"{self.response_id}-play"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if all(t.done() for t in self._tasks) and not self._closed_reported:
            self._closed_reported = True  # both tasks' callbacks may see both done
            for callback in self.closed_callbacks:
                callback(self)

    @property
    def committed(self) -> bool:
        return self._committed.is_set()

    def commit(self) -> None:
        """Make the reply visible and audible. Announced here, synchronously,
        so no later event can refer to a response the client never saw."""
        if self.committed or self.status != "in_progress":
            return
        self._committed.set()
        self.emit(
            ResponseStarted(
                self.response_id,
                self.item_id,
                audio=self.audio,
                in_conversation=self.conversation is not None,
                metadata=self.metadata,
                voice=self.voice,
            )
        )

    def cancel(self, reason: str) -> None:
        """Stop now; a committed reply reports what the user heard. Whatever
        the status, no task of it keeps running (a failed reply's generator
        may still be blocked on the queue nobody reads)."""
        self._cancel_tasks()
        if self.status != "in_progress":
            return
        self.status = "cancelled"
        if not self.committed:
            return
        if self.audio:
            self.output.flush()
        if self._audio_started:
            self.emit(AssistantAudioCleared(self.response_id))
        self._finish("cancelled", reason)

    def _cancel_tasks(self) -> None:
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current and not task.done():
                task.cancel()

    async def wait_closed(self) -> None:
        """Wait until both tasks have really stopped (after ``cancel``)."""
        if not self._tasks:
            return
        # asyncio.wait, not ``await task``: a caller that is itself cancelled
        # (a timeout) gets its CancelledError instead of having it swallowed.
        await asyncio.wait(self._tasks)
        for task in self._tasks:
            if not task.cancelled() and task.exception() is not None:
                log.error(
                    "reply task failed",
                    exc_info=task.exception(),
                    extra={"response_id": self.response_id},
                )

    # -- audio feedback from the output track ----------------------------
    def frame_sent(self, tag: PieceTag) -> None:
        if not self._audio_started:
            self._audio_started = True
            self.metrics.first_frame_sent = now()
            self.emit(AssistantAudioStarted(self.response_id))
        self._pieces.frame_played(tag.index)

    def heard_text(self, first: int = 0) -> str:
        """What the caller heard of the pieces from index ``first`` (see
        ``ReplyPieces.heard_text``)."""
        return self._pieces.heard_text(first)

    def full_text(self) -> str:
        return self._pieces.full_text()

    # -- the two tasks -----------------------------------------------------
    async def _generate(self) -> None:
        if self.failure is not None:
            self._error, self._error_code = self.failure.message, self.failure.code
            await self._apologise(self.failure.spoken)
            await self._queue.put(None)
            return
        if self.script is not None:
            await self._speak([self.script])
            await self._flush_audio()
            self._final_text = self.script
            await self._queue.put(None)
            return
        try:
            self.metrics.llm_request = now()
            log.debug(
                "llm request",
                extra={
                    "response_id": self.response_id,
                    "messages": len(self.messages),
                    "prompt_chars": sum(len(m.content) for m in self.messages),
                },
            )
            await self._run_rounds()
            await self._flush_audio()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the LLM or TTS failed: report, don't crash the session
            log.warning(
                "reply generation failed", exc_info=True, extra={"response_id": self.response_id}
            )
            if isinstance(exc, (LlmError, SynthesisError)):
                reason, self._error_code = public_message(exc), exc.code
            else:
                reason, self._error_code = public_message(exc), "llm_error"
            self._error = f"the reply could not be generated: {reason}"
            # Also after some of the reply was said: a reply that stops
            # mid-sentence, unexplained, leaves the caller waiting.
            await self._apologise()
        await self._queue.put(None)

    async def _apologise(self, text: str | None = None) -> None:
        """Say so rather than stay silent (best effort: TTS may be what failed)."""
        try:
            await self._speak([text or self.reply.apology])
            await self._flush_audio()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("apology failed", exc_info=True, extra={"response_id": self.response_id})

    async def _play_once_committed(self) -> None:
        await self._committed.wait()
        try:
            await self._play_committed()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never leave a committed reply hanging
            log.exception("playing a reply failed", extra={"response_id": self.response_id})
            if self.status == "in_progress":
                if self.audio:
                    self.output.flush()
                self.emit(
                    SessionError(
                        "server_error", f"the reply could not be played: {public_message(exc)}"
                    )
                )
                self.status = "failed"
                self._finish("failed", "error")
            # Nothing reads the queue any more: stop the generator (and its LLM stream).
            self._cancel_tasks()

    async def _play_committed(self) -> None:
        spoken_any = False
        written = 0
        calls: list[FunctionCallRequested] = []
        while (chunk := await self._queue.get()) is not None:
            if isinstance(chunk, FunctionCallRequested):
                calls.append(chunk)
                continue
            piece = chunk.piece
            if not piece.delivered:
                if piece.text:
                    delta = piece.text if not spoken_any else " " + piece.text
                    spoken_any = True
                    self.emit(AssistantTextDelta(self.response_id, self.item_id, delta))
                piece.delivered = True
            if chunk.last:
                piece.complete = True
            if not self.audio or not chunk.audio.size:
                continue
            # The track tags each 20 ms frame with the write that completes it,
            # so a piece owns the frame boundaries that fall inside its samples.
            start, written = written, written + chunk.audio.size
            piece.frames_expected += written // OUTPUT_FRAME_SAMPLES - start // OUTPUT_FRAME_SAMPLES
            await self.output.write(chunk.audio, PieceTag(self.response_id, piece.index))
        if self.audio:
            await self.output.finish()
            await self.output.drain()
        if self._audio_started:
            self.emit(AssistantAudioStopped(self.response_id))
        if calls:
            # Handed over only now, right before the reply ends: a client that
            # answers at once (and asks for the next reply) finds this one done.
            self._give_calls(calls)
        if self._error is not None:
            self.emit(SessionError(self._error_code, self._error))
            self.status = "failed"
            self._finish("failed", self._error_code)
        else:
            self.status = "completed"
            self._finish("completed", None)

    def _finish(
        self, status: Literal["completed", "cancelled", "failed"], reason: str | None
    ) -> None:
        heard = self.full_text() if status == "completed" else self.heard_text()
        if self.failure is None:  # an apology for words never heard answers nothing
            self._record_history(status)
        self.emit(
            ResponseFinished(self.response_id, self.item_id, status, reason, heard, self.metrics)
        )
        if self.on_finished is not None:
            self.on_finished(self)
