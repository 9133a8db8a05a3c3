"""The interfaces every backend of a kind implements."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import numpy as np

T = TypeVar("T")


class VadStream(Protocol):
    """Per-session detector state (recurrent models keep state between frames)."""

    def speech_probability(self, frame: np.ndarray) -> float:
        """Probability that a 20 ms frame of 16 kHz int16 audio holds speech."""
        ...


class VadBackend(Protocol):
    name: str

    def new_stream(self) -> VadStream: ...


class SttBackend(Protocol):
    name: str

    async def transcribe(self, audio: np.ndarray) -> str:
        """Transcribe 16 kHz mono int16 audio."""
        ...

    def close(self) -> None: ...


class TtsBackend(Protocol):
    name: str
    sample_rate: int

    async def synthesize(self, text: str) -> np.ndarray:
        """Synthesize text into mono int16 audio at ``sample_rate``."""
        ...

    def close(self) -> None: ...


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


class LlmError(RuntimeError):
    """The LLM endpoint failed: unreachable, an HTTP error, a timeout, a
    dropped stream. ``code`` is short and machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
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
    """One dedicated thread per model: blocking inference never runs on the
    event loop, and one model never runs two jobs at once (CPU inference
    libraries use every core for a single job already). A job cancelled while
    queued never starts."""

    def __init__(self, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    async def run(self, func: Callable[..., T], *args: object) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(func, *args))

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
