"""Conversation state: instructions and a bounded history of heard turns."""

from __future__ import annotations

from collections import deque

from voice_agent.backends.base import ChatMessage


class Conversation:
    def __init__(self, instructions: str, history_turns: int) -> None:
        self.instructions = instructions
        # One turn is a user message and the reply to it.
        self._history: deque[ChatMessage] = deque(maxlen=max(0, history_turns) * 2)
        self.last_item_id: str | None = None

    def messages_for(self, user_text: str) -> list[ChatMessage]:
        """The prompt for replying to ``user_text`` (not yet in the history)."""
        system = [ChatMessage("system", self.instructions)] if self.instructions else []
        return [*system, *self._history, ChatMessage("user", user_text)]

    def add_user(self, text: str, item_id: str) -> None:
        self._history.append(ChatMessage("user", text))
        self.last_item_id = item_id

    def add_assistant(self, heard_text: str, item_id: str) -> None:
        """Record only what the user actually heard of the reply."""
        if heard_text:
            self._history.append(ChatMessage("assistant", heard_text))
        self.last_item_id = item_id

    @property
    def history(self) -> list[ChatMessage]:
        return list(self._history)
