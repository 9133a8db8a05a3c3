"""Prompt-cache warm-ups: the LLM processes a prompt prefix ahead of the
request that will need it, so that request only processes what is new.

Two kinds, one request in flight per session at most:

- the *history* (after each reply, ``--llm-prefill``): the conversation so far
  and an empty user message;
- the *words so far* (``--llm-prefill-partials``): the history and the user's
  turn as the latest partial transcript has it, while they are still
  speaking. On the embedded server's CPU a prompt token costs ~5 ms
  (bench/prefill.py): a 20-word turn's ~25 tokens would otherwise all be
  processed after the pause, on the critical path.

A prefill is a one-token Chat Completions request: llama.cpp keeps the
prompt's state, and the reply's prompt shares it up to the words that
differ (the prefill's end-of-message tokens are simply not reused). Its
slot is found again by llama-server's prompt-similarity slot choice (or
restored from ``--cache-ram``), so no slot id is pinned.

Prefills are an optimisation only. The reply's own request cancels the
session's prefill in flight (it must never wait behind it), a words
prefill is never queued (one still in flight means the next partial simply
is not prefilled), and a process-wide gate sheds words prefills while any
session's reply is waiting for its first token, or while other sessions'
prefills are already in flight: under load the LLM's time goes to replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence

from voice_agent.backends.base import ChatMessage, LlmBackend, ToolCall, ToolChoice, ToolSpec

log = logging.getLogger(__name__)

# Words prefills in flight at once across a process's sessions. Each is
# ~10 new tokens (the words since the last one, the template's closing
# tokens); more at once would lengthen the batch other sessions' replies
# are decoded in.
DEFAULT_CONCURRENT_WORD_PREFILLS = 2


class PrefillGate:
    """Shared by a process's sessions: how many words prefills may be in
    flight at once, and none while a reply waits for its first token (the
    critical path); one refused is shed (counted), never queued."""

    def __init__(self, limit: int = DEFAULT_CONCURRENT_WORD_PREFILLS) -> None:
        if limit < 1:
            raise ValueError("the prefill gate's limit must be >= 1")
        self.limit = limit
        self.in_flight = 0
        self.replies_waiting = 0  # reply requests sent, no output yet
        self.sent = 0
        self.shed = 0

    def try_enter(self) -> bool:
        if self.in_flight >= self.limit or self.replies_waiting:
            self.shed += 1
            return False
        self.in_flight += 1
        self.sent += 1
        return True

    def leave(self) -> None:
        self.in_flight -= 1

    def stats(self) -> dict[str, int]:
        return {"in_flight": self.in_flight, "sent": self.sent, "shed": self.shed}


class RepliesWatched:
    """The shared LLM as a session's replies call it: the gate counts each
    reply request from its start to its first output (or its end)."""

    def __init__(self, llm: LlmBackend, gate: PrefillGate) -> None:
        self._llm = llm
        self._gate = gate
        self.name = llm.name

    def stream_reply(
        self,
        messages: list[ChatMessage],
        max_tokens: int,
        temperature: float,
        tools: Sequence[ToolSpec] = (),
        tool_choice: ToolChoice = "auto",
    ) -> AsyncIterator[str | ToolCall]:
        stream = self._llm.stream_reply(messages, max_tokens, temperature, tools, tool_choice)
        return self._watched(stream)

    async def _watched(
        self, stream: AsyncIterator[str | ToolCall]
    ) -> AsyncIterator[str | ToolCall]:
        # Runs from the first __anext__: a stream never iterated counts nothing.
        self._gate.replies_waiting += 1
        waiting = True
        try:
            async for output in stream:
                if waiting:
                    self._gate.replies_waiting -= 1
                    waiting = False
                yield output
        finally:
            if waiting:
                self._gate.replies_waiting -= 1
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:  # closes the HTTP response: the server stops
                await aclose()

    async def prefill(self, messages: list[ChatMessage], tools: Sequence[ToolSpec] = ()) -> None:
        await self._llm.prefill(messages, tools)

    async def aclose(self) -> None:
        """Nothing of its own: the engine closes the shared LLM."""


class SessionPrefills:
    """One session's prefill requests."""

    def __init__(self, llm: LlmBackend, session_id: str, gate: PrefillGate | None) -> None:
        self._llm = llm
        self._session_id = session_id
        self._gate = gate
        self._task: asyncio.Task[None] | None = None
        self._words: str | None = None  # the words last prefilled, this turn
        self.words_shed = 0  # words prefills not sent: own one in flight, or the gate refused

    @property
    def in_flight(self) -> bool:
        return self._task is not None and not self._task.done()

    def history(self, messages: list[ChatMessage], tools: Sequence[ToolSpec]) -> None:
        """The conversation so far: replaces any prefill in flight (the
        history has changed under it)."""
        self.cancel()
        self._task = asyncio.create_task(self._send(messages, tools), name="llm-prefill")

    def words(self, words: str, messages: list[ChatMessage], tools: Sequence[ToolSpec]) -> bool:
        """The user's words so far (``messages`` end with them): sent unless
        they were just prefilled, this session's prefill is still in flight,
        or the gate refuses (full, or a reply waits for its first token).
        True when sent."""
        if words == self._words:
            return False
        if self.in_flight or (self._gate is not None and not self._gate.try_enter()):
            self.words_shed += 1
            return False
        self._words = words
        task = asyncio.create_task(self._send(messages, tools), name="llm-prefill-words")
        if self._gate is not None:
            # On the task, not in it: a task cancelled before it first runs
            # never enters its coroutine (nor its finally).
            gate = self._gate
            task.add_done_callback(lambda _: gate.leave())
        self._task = task
        return True

    def cancel(self) -> None:
        """The real request starts (or the session closes): a prefill still
        in flight would only compete with it."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._task = None
        self._words = None

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _send(self, messages: list[ChatMessage], tools: Sequence[ToolSpec]) -> None:
        try:
            await self._llm.prefill(messages, tools)
        except Exception:  # an optimisation only: never fail the session for it
            log.debug("prefill failed", exc_info=True, extra={"session": self._session_id})
