"""One assistant reply: LLM stream -> clause pieces -> TTS -> audio output.

Generation and playback are two tasks joined by a small bounded queue, so
synthesis runs at most a few pieces ahead of what is being played. A reply
can be prepared speculatively (while the user is pausing) and only starts
playing, and only becomes visible to the client, once it is committed.

Cancellation is synchronous: both tasks are cancelled and the output flushed
in one step, so not one more frame of this reply reaches the wire.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from voice_agent.audio.resample import StreamResampler
from voice_agent.backends.base import ChatMessage, LlmBackend, TtsBackend
from voice_agent.session.conversation import Conversation
from voice_agent.session.events import (
    AssistantAudioCleared,
    AssistantAudioStarted,
    AssistantAudioStopped,
    AssistantTextDelta,
    ResponseFinished,
    ResponseStarted,
    SessionError,
    SessionEvent,
)
from voice_agent.session.metrics import TurnMetrics, now
from voice_agent.stages.text_chunker import TextChunker

log = logging.getLogger(__name__)

OUTPUT_RATE = 48_000
OUTPUT_FRAME_SAMPLES = 960
PIECES_AHEAD = 3


class AudioOutput(Protocol):
    """Where replies are played (the paced outbound track)."""

    async def write(self, samples: np.ndarray, tag: Any = None) -> None: ...

    async def finish(self) -> None: ...

    async def drain(self) -> None: ...

    def flush(self) -> None: ...


@dataclass(frozen=True)
class PieceTag:
    response_id: str
    index: int


@dataclass
class _Piece:
    index: int
    text: str
    audio: np.ndarray
    frames_expected: int
    frames_played: int = 0


@dataclass
class ReplySettings:
    max_tokens: int
    temperature: float


Status = Literal["in_progress", "completed", "cancelled", "failed"]


@dataclass(eq=False)
class Response:
    response_id: str
    item_id: str
    messages: list[ChatMessage]
    llm: LlmBackend
    tts: TtsBackend
    output: AudioOutput
    conversation: Conversation
    emit: Callable[[SessionEvent], None]
    reply: ReplySettings
    metrics: TurnMetrics = field(default_factory=TurnMetrics)
    status: Status = "in_progress"
    on_finished: Callable[[Response], None] | None = None

    def __post_init__(self) -> None:
        self._committed = asyncio.Event()
        self._queue: asyncio.Queue[_Piece | None] = asyncio.Queue(maxsize=PIECES_AHEAD)
        self._pieces: dict[int, _Piece] = {}
        self._resampler = StreamResampler(self.tts.sample_rate, OUTPUT_RATE)
        self._audio_started = False
        self._error: str | None = None
        self._raw_text = ""  # exactly what the model generated
        self._tasks: list[asyncio.Task[None]] = []
        # Called once both of its tasks have stopped.
        self.closed_callbacks: list[Callable[[Response], None]] = []

    # -- lifecycle -------------------------------------------------------
    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._generate(), name=f"{self.response_id}-generate"),
            asyncio.create_task(self._play(), name=f"{self.response_id}-play"),
        ]
        for task in self._tasks:
            task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        if all(t.done() for t in self._tasks):
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
        self.emit(ResponseStarted(self.response_id, self.item_id))

    def cancel(self, reason: str) -> None:
        """Stop now; a committed reply reports what the user heard."""
        if self.status != "in_progress":
            return
        for task in self._tasks:
            task.cancel()
        self.status = "cancelled"
        if not self.committed:
            return
        self.output.flush()
        if self._audio_started:
            self.emit(AssistantAudioCleared(self.response_id))
        self._finish("cancelled", reason)

    async def wait_closed(self) -> None:
        """Wait until both tasks have really stopped (after ``cancel``)."""
        for task in self._tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
            except Exception:
                log.exception("reply task failed", extra={"response_id": self.response_id})

    # -- audio feedback from the output track ----------------------------
    def frame_sent(self, tag: PieceTag) -> None:
        if not self._audio_started:
            self._audio_started = True
            self.metrics.first_frame_sent = now()
            self.emit(AssistantAudioStarted(self.response_id))
        piece = self._pieces.get(tag.index)
        if piece is not None:
            piece.frames_played += 1

    def heard_text(self) -> str:
        """Whole pieces that were played, plus the played share of the words
        of the piece that was cut off."""
        words: list[str] = []
        for index in sorted(self._pieces):
            piece = self._pieces[index]
            if piece.frames_played >= piece.frames_expected:
                words.extend(piece.text.split())
                continue
            if piece.frames_played > 0 and piece.frames_expected > 0:
                share = piece.frames_played / piece.frames_expected
                piece_words = piece.text.split()
                words.extend(piece_words[: int(len(piece_words) * share)])
            break
        return " ".join(words)

    def full_text(self) -> str:
        return " ".join(self._pieces[i].text for i in sorted(self._pieces) if self._pieces[i].text)

    # -- the two tasks -----------------------------------------------------
    async def _generate(self) -> None:
        chunker = TextChunker()
        index = 0
        raw: list[str] = []
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
            stream = self.llm.stream_reply(
                self.messages, self.reply.max_tokens, self.reply.temperature
            )
            try:
                async for delta in stream:
                    if self.metrics.llm_first_token is None:
                        self.metrics.llm_first_token = now()
                    raw.append(delta)
                    self._raw_text = "".join(raw)
                    for text in chunker.push(delta):
                        await self._synthesize(index, text)
                        index += 1
            finally:
                # Closing the stream closes the HTTP response: the server stops generating.
                await stream.aclose()  # type: ignore[attr-defined]
            for text in chunker.flush():
                await self._synthesize(index, text)
                index += 1
            tail = self._resampler.process(np.zeros(0, dtype=np.int16), last=True)
            if tail.size:
                await self._enqueue(_Piece(index, "", tail, 0))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the LLM or TTS failed: report, don't crash the session
            log.warning(
                "reply generation failed", exc_info=True, extra={"response_id": self.response_id}
            )
            self._error = f"{type(exc).__name__}: {exc}"
        await self._queue.put(None)

    async def _synthesize(self, index: int, text: str) -> None:
        first = index == 0
        if first:
            self.metrics.first_piece = self.metrics.tts_start = now()
        audio = await self.tts.synthesize(text)
        audio = self._resampler.process(audio)
        if first:
            self.metrics.tts_first_audio = now()
        frames = -(-audio.size // OUTPUT_FRAME_SAMPLES)
        await self._enqueue(_Piece(index, text, audio, frames))

    async def _enqueue(self, piece: _Piece) -> None:
        self._pieces[piece.index] = piece
        await self._queue.put(piece)

    async def _play(self) -> None:
        await self._committed.wait()
        try:
            await self._play_committed()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # never leave a committed reply hanging
            log.exception("playing a reply failed", extra={"response_id": self.response_id})
            if self.status == "in_progress":
                self.output.flush()
                self.emit(SessionError("server_error", f"the reply could not be played: {exc}"))
                self.status = "failed"
                self._finish("failed", "error")

    async def _play_committed(self) -> None:
        spoken_any = False
        written = 0
        while (piece := await self._queue.get()) is not None:
            if piece.text:
                delta = piece.text if not spoken_any else " " + piece.text
                spoken_any = True
                self.emit(AssistantTextDelta(self.response_id, self.item_id, delta))
            # The track tags each 20 ms frame with the write that completes it,
            # so a piece owns the frame boundaries that fall inside its samples.
            start, written = written, written + piece.audio.size
            piece.frames_expected = written // OUTPUT_FRAME_SAMPLES - start // OUTPUT_FRAME_SAMPLES
            await self.output.write(piece.audio, PieceTag(self.response_id, piece.index))
        await self.output.finish()
        await self.output.drain()
        if self._audio_started:
            self.emit(AssistantAudioStopped(self.response_id))
        if self._error is not None:
            self.emit(SessionError("llm_error", f"the reply could not be generated: {self._error}"))
            self.status = "failed"
            self._finish("failed", "error")
        else:
            self.status = "completed"
            self._finish("completed", None)

    def _finish(
        self, status: Literal["completed", "cancelled", "failed"], reason: str | None
    ) -> None:
        heard = self.full_text() if status == "completed" else self.heard_text()
        # A reply heard in full goes into the history exactly as generated, so
        # the LLM server's prompt cache still matches it on the next turn; a
        # cut-off reply keeps only the words the user heard.
        history_text = self._raw_text.strip() if status == "completed" else heard
        self.conversation.add_assistant(history_text)
        self.emit(
            ResponseFinished(self.response_id, self.item_id, status, reason, heard, self.metrics)
        )
        if self.on_finished is not None:
            self.on_finished(self)
