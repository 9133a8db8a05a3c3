"""Conversation state: instructions and a bounded history of heard turns."""

from __future__ import annotations

from voice_agent.backends.base import ChatMessage


class Conversation:
    """Instructions plus the recent turns.

    The history is trimmed in blocks rather than slid one turn at a time:
    LLM servers cache the prompt prefix they saw last, and sliding the window
    changes the prefix right after the system prompt on every turn, so the
    whole history would be processed again each time (on a CPU, seconds).
    Dropping the older half at once keeps the prefix stable for several turns.
    """

    def __init__(self, instructions: str, history_turns: int) -> None:
        self.instructions = instructions
        self.history_turns = max(0, history_turns)
        self._history: list[ChatMessage] = []

    def messages_for(
        self, user_text: str | None, instructions: str | None = None
    ) -> list[ChatMessage]:
        """The prompt for replying to ``user_text`` (not yet in the history),
        or, with None, to the history as it stands (a client's response.create)."""
        instructions = self.instructions if instructions is None else instructions
        system = [ChatMessage("system", instructions)] if instructions else []
        user = [] if user_text is None else [ChatMessage("user", user_text)]
        return [*system, *self._history, *user]

    def add(self, message: ChatMessage) -> None:
        """Any message: an assistant tool call, a tool result, typed user text.
        A tool result goes right after its call (and the call's earlier
        results), wherever later turns have been added: Chat Completions
        refuses a history where anything else comes between them."""
        at = self._result_position(message) if message.role == "tool" else None
        if at is None:
            self._append(message)
        else:
            self._history.insert(at, message)
            self._trim()

    def _result_position(self, result: ChatMessage) -> int | None:
        for index in range(len(self._history) - 1, -1, -1):
            calls = self._history[index].tool_calls
            if any(call.call_id == result.tool_call_id for call in calls):
                at = index + 1
                while at < len(self._history) and self._history[at].role == "tool":
                    at += 1
                return at
        return None

    def has_open_call(self, call_id: str) -> bool:
        """A tool call in the history that has no result yet."""
        called = any(
            call.call_id == call_id for message in self._history for call in message.tool_calls
        )
        answered = any(m.role == "tool" and m.tool_call_id == call_id for m in self._history)
        return called and not answered

    def add_user(self, text: str) -> None:
        self._append(ChatMessage("user", text))

    def add_assistant(self, heard_text: str) -> None:
        """Record only what the user actually heard of the reply."""
        if heard_text:
            self._append(ChatMessage("assistant", heard_text))

    def _append(self, message: ChatMessage) -> None:
        self._history.append(message)
        self._trim()

    def _trim(self) -> None:
        limit = self.history_turns * 2
        if len(self._history) > limit:
            keep = self.history_turns  # half the window, in messages
            self._history = self._history[len(self._history) - keep :] if keep else []
            # Never start the history with a reply to a question it no longer holds.
            while self._history and self._history[0].role != "user":
                self._history.pop(0)

    @property
    def history(self) -> list[ChatMessage]:
        return list(self._history)
