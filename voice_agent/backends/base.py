"""The interfaces every backend of a kind implements."""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from voice_agent.cpu import lower_this_thread

T = TypeVar("T")


class VadStream(Protocol):
    """Per-session detector state (recurrent models keep state between frames)."""

    def speech_probability(self, frame: np.ndarray) -> float:
        """Probability that a 20 ms frame of 16 kHz int16 audio holds speech."""
        ...


class VadBackend(Protocol):
    name: str

    def new_stream(self) -> VadStream: ...


class TurnBackend(Protocol):
    """Says whether a caller has finished their turn. ``semantic`` False:
    no model, the silence alone ends turns."""

    name: str
    semantic: bool

    async def completion(self, audio: np.ndarray) -> float:
        """Probability that the turn in ``audio`` (16 kHz mono int16, the
        turn so far with the silence after it) is finished."""
        ...

    def close(self) -> None: ...


class WordsBackend(Protocol):
    """Reads a transcript for the end of turn: how likely a sentence ends
    where its words stop (0-1)."""

    name: str

    async def completion(self, text: str) -> float: ...

    async def close(self) -> None: ...


class SttBackend(Protocol):
    name: str

    async def transcribe(self, audio: np.ndarray) -> str:
        """Transcribe 16 kHz mono int16 audio."""
        ...

    def close(self) -> None: ...


class TtsBackend(Protocol):
    name: str
    sample_rate: int

    def voices(self) -> Sequence[str]:
        """The voice names this backend speaks with; the first is the default."""
        ...

    def stream(
        self, text: str, voice: str | None = None, urgent: bool = False
    ) -> AsyncIterator[np.ndarray]:
        """Synthesize text into mono int16 chunks at ``sample_rate``, yielded
        as they are produced (a backend that makes a piece at once yields it
        once). ``voice`` is one of ``voices()``, None for the default. An
        ``urgent`` piece (a reply's first: the caller hears nothing until it
        starts) goes before pieces whose turn to play has not come yet.
        Closing the iterator (or cancelling its consumer) stops synthesis
        before the next chunk."""
        ...

    def close(self) -> None: ...


async def synthesize(
    tts: TtsBackend, text: str, voice: str | None = None, urgent: bool = False
) -> np.ndarray:
    """The whole of a piece at once (for the model process, checks, warm-up)."""
    chunks = [chunk async for chunk in tts.stream(text, voice, urgent)]
    if not chunks:
        return np.zeros(0, dtype=np.int16)
    return np.concatenate(chunks).astype(np.int16, copy=False)


@dataclass(frozen=True)
class ToolCall:
    """A complete function call the model made (its arguments a JSON string)."""

    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call: name, description, JSON schema of its arguments."""

    name: str
    description: str
    parameters: dict[str, Any]


@dataclass(frozen=True)
class ChatMessage:
    """One conversation message. An assistant message may carry the tool
    calls it made; a ``tool`` message is one call's result (``tool_call_id``)."""

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None


# "auto" | "none" | "required" | {"type": "function", "name": ...} (Realtime's shape).
ToolChoice = str | dict[str, str]


class BackendError(RuntimeError):
    """A backend failed. ``str()`` is the whole story, for the log: it may
    quote an upstream's answer or name its address. ``public`` is what a
    caller may be told: the same minus anything an upstream said or where
    it lives (a provider's message can quote a masked key or name internal
    hosts)."""

    def __init__(self, message: str, public: str | None = None) -> None:
        super().__init__(message)
        self.public = message if public is None else public


def public_message(exc: BaseException) -> str:
    """What a caller may be told of ``exc``: a backend's public message, or
    only the kind of an unexpected error."""
    return exc.public if isinstance(exc, BackendError) else type(exc).__name__


class LlmError(BackendError):
    """The LLM endpoint failed: unreachable, an HTTP error, a timeout, a
    dropped stream. ``code`` is short and machine-readable."""

    def __init__(self, code: str, message: str, public: str | None = None) -> None:
        super().__init__(message, public)
        self.code = code


class LlmBackend(Protocol):
    name: str

    def stream_reply(
        self,
        messages: list[ChatMessage],
        max_tokens: int,
        temperature: float,
        tools: Sequence[ToolSpec] = (),
        tool_choice: ToolChoice = "auto",
    ) -> AsyncIterator[str | ToolCall]:
        """Yield the reply's text deltas as they are generated, and each tool
        call once its fragments are complete. Closing the iterator (or
        cancelling its consumer) must abort the request upstream. Failures
        raise ``LlmError``."""
        ...

    async def prefill(self, messages: list[ChatMessage], tools: Sequence[ToolSpec] = ()) -> None:
        """Have the server process (and cache) a prompt prefix ahead of time."""
        ...

    async def aclose(self) -> None: ...


class InferenceWorker:
    """A model's dedicated thread: blocking inference never runs on the event
    loop, and by default one model never runs two jobs at once (CPU inference
    libraries use every core of a small machine for a single job already;
    ``threads`` above 1 is for machines with cores to spare). A job cancelled
    while queued never starts."""

    def __init__(self, name: str, threads: int = 1, lowered: bool = True) -> None:
        """``lowered`` False: the thread keeps the process's priority (a
        small job on every turn's critical path, not to wait behind STT)."""
        self._executor = ThreadPoolExecutor(
            max_workers=threads,
            thread_name_prefix=name,
            initializer=lower_this_thread if lowered else None,
        )

    async def run(self, func: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(func, *args))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class PriorityInferenceWorker:
    """A model's threads, like InferenceWorker, whose waiting jobs are
    taken urgent ones first. Sessions share the model: one caller's first
    words are not made to wait behind another caller's later sentences,
    which have the audio before them as slack. A job cancelled while queued
    never starts. ``parallel`` jobs run at once (a big machine: one model,
    several syntheses, each with its own intra-op threads); 1 on a small one,
    where one job already uses every core."""

    def __init__(self, name: str, parallel: int = 1) -> None:
        self._executor = ThreadPoolExecutor(
            max_workers=parallel, thread_name_prefix=name, initializer=lower_this_thread
        )
        self._parallel = parallel
        self._urgent: deque[_Job[Any]] = deque()
        self._normal: deque[_Job[Any]] = deque()
        self._running = 0

    async def run(self, func: Callable[..., T], *args: object, urgent: bool = False) -> T:
        job: _Job[T] = _Job(asyncio.get_running_loop().create_future(), func, args)
        (self._urgent if urgent else self._normal).append(job)
        self._next()
        return await job.future

    def _next(self) -> None:
        while self._running < self._parallel and (self._urgent or self._normal):
            job = (self._urgent or self._normal).popleft()
            if job.future.done():  # its caller went away while it waited
                continue
            loop = job.future.get_loop()
            try:
                running = loop.run_in_executor(
                    self._executor, functools.partial(job.func, *job.args)
                )
            except RuntimeError as exc:  # closed: the executor takes no more jobs
                job.future.set_exception(exc)
                continue
            self._running += 1
            running.add_done_callback(functools.partial(self._finished, job))

    def _finished(self, job: _Job[Any], running: asyncio.Future[Any]) -> None:
        self._running -= 1
        if not job.future.done():
            if running.cancelled():
                job.future.cancel()
            elif (error := running.exception()) is not None:
                job.future.set_exception(error)
            else:
                job.future.set_result(running.result())
        self._next()

    @property
    def idle(self) -> bool:
        """No job running or waiting."""
        return self._running == 0 and not self._urgent and not self._normal

    def close(self) -> None:
        for job in (*self._urgent, *self._normal):
            job.future.cancel()
        self._urgent.clear()
        self._normal.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)


@dataclass
class _Job(Generic[T]):
    future: asyncio.Future[T]
    func: Callable[..., T]
    args: tuple[object, ...]
