"""A reply's LLM rounds, the tool calls between them, and what the history
keeps of them.

A reply is one or more LLM rounds: a round that calls server tools runs
them (only once the reply is committed: tools may act on the world) and
asks again with their results; a round that calls client tools hands the
calls over as the reply ends; the last round allowed must speak. The
rounds that ran are recorded with the reply's message, so the history
matches what the LLM server cached, or, for a reply cut off, the rounds
that ran and the words heard. Apart from the response because it is the
reply's conversation with the LLM; the response runs it in its generate
task and records it when it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from voice_agent.backends.base import (
    ChatMessage,
    LlmBackend,
    LlmError,
    ToolCall,
    ToolChoice,
    ToolSpec,
)
from voice_agent.session.conversation import Conversation
from voice_agent.session.events import FunctionCallRequested, SessionEvent
from voice_agent.session.ids import new_id
from voice_agent.session.metrics import TurnMetrics, now
from voice_agent.session.reply_pieces import ReplyPieces
from voice_agent.session.reply_speech import Chunk
from voice_agent.session.tools import ToolRegistry
from voice_agent.stages.text_chunker import TextChunker
from voice_agent.stages.text_filter import SpokenTextFilter, strip_thinking

if TYPE_CHECKING:
    from voice_agent.session.reply import ReplySettings

# The response's parts log as the response: one logger name to filter and set levels on.
log = logging.getLogger("voice_agent.session.reply")


class ToolRounds:
    """Runs and records the reply's LLM rounds (a mixin of ``Reply``,
    over its state)."""

    response_id: str
    item_id: str
    messages: list[ChatMessage]
    llm: LlmBackend
    conversation: Conversation | None
    emit: Callable[[SessionEvent], None]
    reply: ReplySettings
    metrics: TurnMetrics
    tools: Sequence[ToolSpec]
    tool_choice: ToolChoice
    server_tools: ToolRegistry | None
    _committed: asyncio.Event
    _queue: asyncio.Queue[Chunk | FunctionCallRequested | None]
    _pieces: ReplyPieces
    _final_text: str
    _next_index: int
    _exchange: list[ChatMessage]
    _covered_pieces: int
    _client_round: tuple[list[ChatMessage], list[ChatMessage], int] | None

    if TYPE_CHECKING:

        async def _speak(self, texts: list[str]) -> None: ...  # ReplySpeech's

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
                if not client_calls and not self._pieces.spoke():
                    raise LlmError(
                        "tool_step_limit",
                        f"the model still called tools after {steps} rounds and said nothing",
                    )
            if not server_calls and not client_calls:
                if not self._pieces.spoke():
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

    def _record_history(self, status: Literal["completed", "cancelled", "failed"]) -> None:
        # A reply heard in full goes into the history exactly as generated
        # (with its tool calls and results), so the LLM server's prompt cache
        # still matches it on the next turn; a cut-off reply keeps only the
        # words the user heard.
        if status == "completed":
            self._record_exchange()
            if self.conversation is not None:
                self.conversation.add_assistant(
                    self._final_text.strip(),
                    self.item_id,
                    self._pieces.spoken(self._covered_pieces),
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
                self._pieces.heard_text(self._covered_pieces),
                self.item_id,
                self._pieces.spoken(self._covered_pieces),
            )
