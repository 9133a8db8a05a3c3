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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from voice_agent.audio.pcm import sound_onset
from voice_agent.audio.resample import StreamResampler
from voice_agent.backends.base import (
    ChatMessage,
    LlmBackend,
    LlmError,
    ToolCall,
    ToolChoice,
    ToolSpec,
    TtsBackend,
)
from voice_agent.session.conversation import Conversation, SpokenPiece, SpokenText
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
from voice_agent.session.ids import new_id
from voice_agent.session.metrics import TurnMetrics, now
from voice_agent.session.tools import ToolRegistry
from voice_agent.stages.text_chunker import TextChunker
from voice_agent.stages.text_filter import SpokenTextFilter, strip_thinking

log = logging.getLogger(__name__)

OUTPUT_RATE = 48_000
OUTPUT_FRAME_SAMPLES = 960
# Frames a piece whose audio never came in full would have lasted: speech
# runs at about 15 characters a second, 3.3 frames a character.
FRAMES_PER_CHAR = 3.3
# A reply's leading near-silence: below -40 dBFS (peak) is not heard yet;
# 10 ms of it is kept so the onset is not clipped.
LEAD_THRESHOLD = 328
LEAD_KEPT_S = 0.010
CHUNKS_AHEAD = 3
_NO_AUDIO = np.zeros(0, dtype=np.int16)


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
class _Piece:
    """One clause of the reply. Its frames are counted as its chunks are
    written; ``complete`` once the last of them was (a piece whose stream
    broke off, or is still coming, is not)."""

    index: int
    text: str
    frames_expected: int = 0
    frames_played: int = 0
    delivered: bool = False  # its words were told to the client
    complete: bool = False


@dataclass(frozen=True)
class _Chunk:
    """Audio of a piece as the TTS made it (the first one carries its words)."""

    piece: _Piece
    audio: np.ndarray
    last: bool = False  # no audio: the piece's chunks have all come before it


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


class SynthesisError(RuntimeError):
    """The TTS could not speak a piece of the reply."""

    code = "tts_error"


@dataclass(eq=False)
class Response:
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
    on_finished: Callable[[Response], None] | None = None
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
        self._queue: asyncio.Queue[_Chunk | FunctionCallRequested | None] = asyncio.Queue(
            maxsize=CHUNKS_AHEAD
        )
        self._pieces: dict[int, _Piece] = {}
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
        self.closed_callbacks: list[Callable[[Response], None]] = []
        self._closed_reported = False

    # -- lifecycle -------------------------------------------------------
    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._generate(), name=f"{self.response_id}-generate"),
            asyncio.create_task(self._play(), name=f"{self.response_id}-play"),
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
        piece = self._pieces.get(tag.index)
        if piece is not None:
            piece.frames_played += 1

    def heard_text(self, first: int = 0) -> str:
        """Whole pieces that were played, plus the played share of the words
        of the piece that was cut off (of the pieces from index ``first``);
        of a text-only reply, the pieces told to the client."""
        words: list[str] = []
        for index in sorted(i for i in self._pieces if i >= first):
            piece = self._pieces[index]
            if not self.audio:
                if not piece.delivered:
                    break
                words.extend(piece.text.split())
                continue
            if not piece.delivered:  # no audio of it ever reached the track
                break
            if piece.complete and piece.frames_played >= piece.frames_expected:
                words.extend(piece.text.split())
                continue
            # Cut off; if its stream broke off (or was still coming), its
            # length is estimated from its text.
            expected = piece.frames_expected
            if not piece.complete:
                expected = max(expected, int(len(piece.text) * FRAMES_PER_CHAR))
            if piece.frames_played > 0 and expected > 0:
                share = min(1.0, piece.frames_played / expected)
                piece_words = piece.text.split()
                words.extend(piece_words[: int(len(piece_words) * share)])
            break
        return " ".join(words)

    def full_text(self) -> str:
        return " ".join(self._pieces[i].text for i in sorted(self._pieces) if self._pieces[i].text)

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
                reason, self._error_code = str(exc), exc.code
            else:
                reason, self._error_code = f"{type(exc).__name__}: {exc}", "llm_error"
            self._error = f"the reply could not be generated: {reason}"
            # Also after some of the reply was said: a reply that stops
            # mid-sentence, unexplained, leaves the caller waiting.
            await self._apologise()
        await self._queue.put(None)

    async def _flush_audio(self) -> None:
        """The resampler's last samples, as a silent-text piece."""
        if not self.audio:
            return
        tail = self._resampler.process(np.zeros(0, dtype=np.int16), last=True)
        if tail.size:
            piece = self._new_piece(self._next_index, "")
            await self._queue.put(_Chunk(piece, tail))
            await self._queue.put(_Chunk(piece, _NO_AUDIO, last=True))
            self._next_index += 1

    async def _speak(self, texts: list[str]) -> None:
        for text in texts:
            await self._synthesize(self._next_index, text)
            self._next_index += 1

    async def _run_rounds(self) -> None:
        """LLM rounds until the model answers without calling a server tool,
        or calls a client tool (the client answers and asks for the next
        reply itself), or the step limit is reached: the last round offers
        the tools with tool_choice "none", so the model has to speak."""
        messages = list(self.messages)
        steps = max(1, self.reply.max_tool_steps)
        registry = self.server_tools
        for step in range(steps):
            last = step == steps - 1
            forced_answer = last and step > 0 and bool(self.tools)
            text, calls = await self._one_round(
                messages, "none" if forced_answer else self.tool_choice
            )
            server_calls = [c for c in calls if registry is not None and c.name in registry]
            client_calls = [c for c in calls if c not in server_calls]
            if last and server_calls:
                log.warning(
                    "tool step limit reached",
                    extra={"response_id": self.response_id, "steps": steps},
                )
                server_calls = []  # never run: no round is left to read their results
                if not client_calls and not self._spoke():
                    raise LlmError(
                        "tool_step_limit",
                        f"the model still called tools after {steps} rounds and said nothing",
                    )
            if not server_calls and not client_calls:
                if not self._spoke():
                    # Silence and no error would leave the user waiting: apologise.
                    raise LlmError("empty_reply", "the LLM returned an empty reply")
                self._final_text = text
                return
            call_message = ChatMessage("assistant", text, tool_calls=(*server_calls, *client_calls))
            messages.append(call_message)
            results: list[ChatMessage] = []
            if server_calls and registry is not None:
                # Tools may act on the world: only for a reply that is really given.
                await self._committed.wait()
                outputs = await asyncio.gather(*(registry.call(c) for c in server_calls))
                for call, output in zip(server_calls, outputs, strict=True):
                    log.info(
                        "tool called", extra={"response_id": self.response_id, "tool": call.name}
                    )
                    results.append(ChatMessage("tool", output, tool_call_id=call.call_id))
                messages.extend(results)
            if not client_calls:
                # This round ran in full: even a reply cut off later keeps it,
                # so the model knows a tool acted.
                self._exchange += [call_message, *results]
                self._covered_pieces = self._next_index
            else:
                ran = [ChatMessage("assistant", text, tool_calls=tuple(server_calls))]
                self._client_round = (
                    [call_message, *results],
                    [*ran, *results] if server_calls else [],
                    self._next_index,
                )
                for c in client_calls:
                    request = FunctionCallRequested(
                        self.response_id, new_id("item"), c.call_id, c.name, c.arguments
                    )
                    await self._queue.put(request)
                return

    def _spoke(self) -> bool:
        return any(piece.text for piece in self._pieces.values())

    async def _one_round(
        self, messages: list[ChatMessage], choice: ToolChoice
    ) -> tuple[str, list[ToolCall]]:
        """Stream one LLM request, speaking its text; return the raw text and tool calls."""
        chunker = TextChunker()
        spoken = SpokenTextFilter()
        raw: list[str] = []
        calls: list[ToolCall] = []
        stream = self.llm.stream_reply(
            messages, self.reply.max_tokens, self.reply.temperature, self.tools, choice
        )
        try:
            async for output in stream:
                if self.metrics.llm_first_token is None:
                    self.metrics.llm_first_token = now()
                if isinstance(output, ToolCall):
                    calls.append(output)
                    continue
                raw.append(output)
                await self._speak(chunker.push(spoken.push(output)))
        finally:
            # Closing the stream closes the HTTP response: the server stops generating.
            await stream.aclose()  # type: ignore[attr-defined]
        await self._speak(chunker.push(spoken.flush()))
        await self._speak(chunker.flush())
        return strip_thinking("".join(raw)), calls

    async def _apologise(self, text: str | None = None) -> None:
        """Say so rather than stay silent (best effort: TTS may be what failed)."""
        try:
            await self._speak([text or self.reply.apology])
            await self._flush_audio()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("apology failed", exc_info=True, extra={"response_id": self.response_id})

    def _new_piece(self, index: int, text: str) -> _Piece:
        piece = self._pieces[index] = _Piece(index, text)
        return piece

    async def _synthesize(self, index: int, text: str) -> None:
        piece = self._new_piece(index, text)
        if not self.audio:
            await self._queue.put(_Chunk(piece, _NO_AUDIO, last=True))
            return
        first = index == 0
        if first:
            self.metrics.first_piece = self.metrics.tts_start = now()
        trimming = first and self.reply.trim_lead
        chunks = self.tts.stream(text, self.voice, urgent=first)
        try:
            async for made in chunks:
                if trimming:
                    # Until the voice is heard: the first frame on the wire is sound.
                    onset = sound_onset(
                        made, LEAD_THRESHOLD, int(LEAD_KEPT_S * self.tts.sample_rate)
                    )
                    if onset is None:
                        continue
                    made, trimming = made[onset:], False
                audio = self._resampler.process(made)
                if not audio.size:
                    continue
                if first and self.metrics.tts_first_audio is None:
                    self.metrics.tts_first_audio = now()
                await self._queue.put(_Chunk(piece, audio))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise SynthesisError(f"speech synthesis failed: {type(exc).__name__}: {exc}") from exc
        finally:
            # Stops the backend before its next chunk (a barge-in, a failure).
            await chunks.aclose()  # type: ignore[attr-defined]
        # Also a piece without audio: its words are still the reply's.
        await self._queue.put(_Chunk(piece, _NO_AUDIO, last=True))

    async def _play(self) -> None:
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
                self.emit(SessionError("server_error", f"the reply could not be played: {exc}"))
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

    def _give_calls(self, calls: list[FunctionCallRequested]) -> None:
        assert self._client_round is not None
        whole, _, covered = self._client_round
        self._client_round = None
        self._exchange += whole
        self._covered_pieces = covered
        # The client may answer at once: its result must follow the call.
        self._record_exchange()
        for call in calls:
            self.emit(call)

    def _record_exchange(self) -> None:
        if self.conversation is not None:
            for message in self._exchange:
                # Text said before a call belongs to this reply's message item;
                # server tools' results are no item the client knows.
                item_id = self.item_id if message.role == "assistant" else None
                self.conversation.add(message, item_id)
        self._exchange.clear()

    def _spoken(self) -> SpokenText | None:
        """The timing of the last round's pieces (the message's own words)."""
        if not self.audio:
            return None
        indices = sorted(self._pieces)
        before = sum(self._pieces[i].frames_played for i in indices if i < self._covered_pieces)
        pieces = tuple(
            SpokenPiece(p.text, p.frames_expected, p.frames_played)
            for p in (self._pieces[i] for i in indices if i >= self._covered_pieces)
        )
        return SpokenText(before, pieces)

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

    def _record_history(self, status: Literal["completed", "cancelled", "failed"]) -> None:
        # A reply heard in full goes into the history exactly as generated
        # (with its tool calls and results), so the LLM server's prompt cache
        # still matches it on the next turn; a cut-off reply keeps only the
        # words the user heard.
        if status == "completed":
            self._record_exchange()
            if self.conversation is not None:
                self.conversation.add_assistant(
                    self._final_text.strip(), self.item_id, self._spoken()
                )
            return
        # The rounds that ran stay (a tool may have acted), client calls
        # only if the client was given them; then the words heard of the
        # round in progress, never text a tool-call message already holds.
        if self._client_round is not None:
            _, ran, covered = self._client_round
            self._client_round = None
            if ran:
                self._exchange += ran
                self._covered_pieces = covered
        self._record_exchange()
        if self.conversation is not None:
            self.conversation.add_assistant(
                self.heard_text(self._covered_pieces), self.item_id, self._spoken()
            )
