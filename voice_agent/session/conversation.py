"""Conversation state: instructions and a bounded history of heard turns.

Each message may carry the id of the conversation item it belongs to (a
user turn, a reply's message, a function call's output), so a client can
delete or truncate items and the history the LLM sees next follows.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from voice_agent.backends.base import ChatMessage

FRAME_MS = 20  # the output track's frame


@dataclass(frozen=True)
class SpokenPiece:
    text: str
    frames: int  # 20 ms frames of output audio the piece spans
    played: int  # how many of them were played


@dataclass(frozen=True)
class SpokenText:
    """The pieces of a reply's message with the timing of their audio:
    enough to cut the message where the listener stopped hearing it."""

    offset_frames: int  # frames of the reply played before these pieces (earlier tool rounds)
    pieces: tuple[SpokenPiece, ...]

    @property
    def played_ms(self) -> int:
        return (self.offset_frames + sum(p.played for p in self.pieces)) * FRAME_MS

    def heard_until(self, audio_end_ms: int) -> str:
        """The words heard up to ``audio_end_ms`` of the reply's audio: whole
        pieces, then the share of the words of the piece cut there."""
        position = audio_end_ms / FRAME_MS - self.offset_frames
        words: list[str] = []
        start = 0
        for piece in self.pieces:
            end = start + piece.frames
            if position >= end:
                words.extend(piece.text.split())
            else:
                if position > start and piece.frames:
                    piece_words = piece.text.split()
                    words.extend(
                        piece_words[: int(len(piece_words) * (position - start) / piece.frames)]
                    )
                break
            start = end
        return " ".join(words)


@dataclass
class _Entry:
    message: ChatMessage
    item_id: str | None = None
    spoken: SpokenText | None = None


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
        self._entries: list[_Entry] = []

    def messages_for(
        self, user_text: str | None, instructions: str | None = None
    ) -> list[ChatMessage]:
        """The prompt for replying to ``user_text`` (not yet in the history),
        or, with None, to the history as it stands (a client's response.create).

        With ``user_text``, the history is the one that will stand once those
        words join it, trimmed if they overflow the window: the prompt (and so
        the prefill of the next turn, made with empty words) then starts with
        what the LLM server will see on the turns that follow, and its cache
        holds. (Cut when the words are added, after the prefill, the history
        would make the LLM process all of it again on every third reply's
        critical path: 130-170 tokens, 0.5-0.6 s on 2 cores.)"""
        if user_text is None:
            return self.prompt(self.history, instructions)
        user = _Entry(ChatMessage("user", user_text))
        # The words are the newest entry: always kept.
        history = [e.message for e in _trimmed([*self._entries, user], self.history_turns)[:-1]]
        return self.prompt([*history, user.message], instructions)

    def prompt(
        self, messages: list[ChatMessage], instructions: str | None = None
    ) -> list[ChatMessage]:
        """``messages`` after the (session's or given) instructions."""
        instructions = self.instructions if instructions is None else instructions
        system = [ChatMessage("system", instructions)] if instructions else []
        return [*system, *messages]

    def add(self, message: ChatMessage, item_id: str | None = None) -> None:
        """Any message: an assistant tool call, a tool result, typed user text.
        A tool result goes right after its call (and the call's earlier
        results), wherever later turns have been added: Chat Completions
        refuses a history where anything else comes between them."""
        entry = _Entry(message, item_id)
        at = self._result_position(message) if message.role == "tool" else None
        if at is None:
            self._append(entry)
        else:
            self._entries.insert(at, entry)
            self._trim()

    def _result_position(self, result: ChatMessage) -> int | None:
        for index in range(len(self._entries) - 1, -1, -1):
            calls = self._entries[index].message.tool_calls
            if any(call.call_id == result.tool_call_id for call in calls):
                at = index + 1
                while at < len(self._entries) and self._entries[at].message.role == "tool":
                    at += 1
                return at
        return None

    def has_open_call(self, call_id: str) -> bool:
        """A tool call in the history that has no result yet."""
        history = self.history
        called = any(call.call_id == call_id for message in history for call in message.tool_calls)
        answered = any(m.role == "tool" and m.tool_call_id == call_id for m in history)
        return called and not answered

    def add_user(self, text: str, item_id: str | None = None) -> None:
        self._append(_Entry(ChatMessage("user", text), item_id))

    def add_assistant(
        self, heard_text: str, item_id: str | None = None, spoken: SpokenText | None = None
    ) -> None:
        """Record only what the user actually heard of the reply."""
        if heard_text:
            self._append(_Entry(ChatMessage("assistant", heard_text), item_id, spoken))

    # -- items ---------------------------------------------------------------
    def message(self, item_id: str) -> ChatMessage | None:
        """The message of an item still in the history (its text, for a reply
        whose text came with tool calls)."""
        return next((e.message for e in self._entries if e.item_id == item_id), None)

    def delete(self, item_id: str) -> bool:
        """Forget an item's words. A message that also made tool calls keeps
        its calls (they are items of their own) and loses only its text."""
        changed = False
        kept: list[_Entry] = []
        for entry in self._entries:
            if entry.item_id != item_id:
                kept.append(entry)
                continue
            changed = True
            if entry.message.tool_calls:
                entry.message = dataclasses.replace(entry.message, content="")
                entry.spoken = None
                kept.append(entry)
        self._entries = kept
        return changed

    def delete_call(self, call_id: str) -> bool:
        """Forget a tool call and its result (a result without its call, or a
        call message left empty, would make every later request invalid)."""
        changed = False
        kept: list[_Entry] = []
        for entry in self._entries:
            message = entry.message
            if message.role == "tool" and message.tool_call_id == call_id:
                changed = True
                continue
            calls = tuple(c for c in message.tool_calls if c.call_id != call_id)
            if len(calls) != len(message.tool_calls):
                changed = True
                if not calls and not message.content:
                    continue
                entry.message = dataclasses.replace(message, tool_calls=calls)
            kept.append(entry)
        self._entries = kept
        return changed

    def spoken(self, item_id: str) -> SpokenText | None:
        """The timing of a reply's message still in the history."""
        return next((e.spoken for e in self._entries if e.item_id == item_id and e.spoken), None)

    def truncate(self, item_id: str, audio_end_ms: int) -> str | None:
        """Cut a reply's message to what was heard by ``audio_end_ms``; the
        words kept, or None when the history holds no audio of that item."""
        for index, entry in enumerate(self._entries):
            if entry.item_id != item_id or entry.spoken is None:
                continue
            kept = entry.spoken.heard_until(audio_end_ms)
            if kept:
                entry.message = dataclasses.replace(entry.message, content=kept)
            else:
                del self._entries[index]
            return kept
        return None

    # -- bounds --------------------------------------------------------------
    @property
    def window(self) -> int:
        """The most messages the history keeps (at least one)."""
        return 2 * self.history_turns + 1

    def _append(self, entry: _Entry) -> None:
        self._entries.append(entry)
        self._trim()

    def _trim(self) -> None:
        self._entries = _trimmed(self._entries, self.history_turns)

    @property
    def history(self) -> list[ChatMessage]:
        return [entry.message for entry in self._entries]


def _trimmed(entries: list[_Entry], history_turns: int) -> list[_Entry]:
    """``entries`` within a window of ``history_turns`` past turns plus the
    newest words: past it, only the newer half is kept (see Conversation).
    The window counts the words apart, so a reply's prompt holds every past
    turn of the window, and the history is cut when the reply that overflows
    it is added: before the next turn's prefill, so the two agree."""
    if not history_turns:
        return []
    if len(entries) <= 2 * history_turns + 1:  # Conversation.window
        return entries
    users = [i for i, entry in enumerate(entries) if entry.message.role == "user"]
    start = len(entries) - history_turns - 1
    # The cut is always at a user's words: never a reply, a tool call or a
    # tool result to a question the history no longer holds. When the last
    # exchange alone fills the window (tool rounds), it is kept whole.
    at = next((i for i in users if i >= start), users[-1] if users else len(entries))
    return entries[at:]
