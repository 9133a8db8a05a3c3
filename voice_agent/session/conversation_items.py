"""The client's edits of the conversation: typed messages, function
results, and items read, deleted or truncated.

A typed message that arrives while a reply is being given is held until
that reply ends (the replies part releases it), so that it follows the
reply's own message in the history; reading or deleting an item sees the
held ones too. Apart because these are edits of the history the next reply
will read, with no effect on turns or audio.
"""

from __future__ import annotations

from voice_agent.backends.base import ChatMessage
from voice_agent.session.state import SessionState


class ItemError(ValueError):
    """A conversation item that cannot be changed as asked."""


class ConversationItems(SessionState):
    """Adds to and edits the session's conversation history."""

    def add_user_text(self, text: str, item_id: str | None = None) -> None:
        """A typed user message (``conversation.item.create``); no reply by
        itself. While a reply is being given it waits for that reply's own
        message, which joins the history only when the reply ends."""
        if self._replying():
            self._held_texts.append((text, item_id))
            # Only the newest can be in the history's window once they join
            # it (Conversation trims the rest): holding more holds memory.
            del self._held_texts[: -self.conversation.window]
        else:
            self.conversation.add_user(text, item_id)

    def add_function_output(self, call_id: str, output: str, item_id: str | None = None) -> bool:
        """The client's result for a function call it was asked to run; False
        (nothing added) unless that call was made and is still unanswered:
        an orphan result would make every later LLM request invalid."""
        if not self.conversation.has_open_call(call_id):
            return False
        self.conversation.add(ChatMessage("tool", output, tool_call_id=call_id), item_id)
        return True

    def item_message(self, item_id: str) -> ChatMessage | None:
        """The history's message for an item (a typed text still held counts)."""
        held = next((text for text, held_id in self._held_texts if held_id == item_id), None)
        if held is not None:
            return ChatMessage("user", held)
        return self.conversation.message(item_id)

    def delete_item(self, item_id: str) -> bool:
        """Take an item's words out of the history; False if it holds none."""
        held = len(self._held_texts)
        self._held_texts = [(t, i) for t, i in self._held_texts if i != item_id]
        return self.conversation.delete(item_id) or len(self._held_texts) != held

    def delete_function_call(self, call_id: str) -> bool:
        """Take a function call (and its result) out of the history."""
        return self.conversation.delete_call(call_id)

    def truncate_item(self, item_id: str, audio_end_ms: int) -> str:
        """Keep only the words of a reply heard by ``audio_end_ms`` of its
        audio; returns them ("" when the history holds none of them)."""
        spoken = self.conversation.spoken(item_id)
        if spoken is None:
            return ""
        if audio_end_ms > spoken.played_ms:
            raise ItemError(
                f"audio_end_ms {audio_end_ms} is beyond the item's audio "
                f"({spoken.played_ms} ms were played)"
            )
        kept = self.conversation.truncate(item_id, audio_end_ms)
        return kept or ""
