"""The conversation's items as the client knows them, and the client events
that work on them: ``conversation.item.retrieve``, ``.delete`` and
``.truncate``. Deleting or truncating changes the history the LLM sees next
(the session does that); this module keeps the items' wire form."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from voice_agent.realtime.errors import ClientEventError
from voice_agent.session.session import ItemError, VoiceSession

JsonDict = dict[str, Any]
# Items kept for retrieval (the oldest are forgotten first); the history the
# LLM sees is shorter still (--llm-history-turns). Bounded in number and in
# size: a client may add items of up to 256 KiB, and a thousand of them
# held a quarter of a gigabyte for one call. An hour of talk is ~100 KB.
MAX_ITEMS = 1024
MAX_ITEM_CHARS = 4 * 1024 * 1024


class ItemLog:
    """Items in conversation order, each as last told to the client."""

    def __init__(self, limit: int = MAX_ITEMS, max_chars: int = MAX_ITEM_CHARS) -> None:
        self._items: OrderedDict[str, JsonDict] = OrderedDict()
        self._limit = limit
        self._max_chars = max_chars
        self._sizes: dict[str, int] = {}  # item id -> characters of its JSON
        self._chars = 0
        self._busy: set[str] = set()  # items still being transcribed or generated

    @property
    def last_id(self) -> str | None:
        return next(reversed(self._items), None)

    def place(self, item: JsonDict, busy: bool = False) -> str | None:
        """Append an item; returns the id of the item before it."""
        previous = self.last_id
        self._items[item["id"]] = item
        self._measure(item)
        if busy:
            self._busy.add(item["id"])
        while len(self._items) > self._limit or (
            self._chars > self._max_chars and len(self._items) > 1
        ):
            forgotten, _ = self._items.popitem(last=False)
            self._chars -= self._sizes.pop(forgotten, 0)
            self._busy.discard(forgotten)
        return previous

    def update(self, item: JsonDict) -> None:
        """An item's final form (kept in its place)."""
        if item["id"] in self._items:
            self._items[item["id"]] = item
            self._measure(item)
        self._busy.discard(item["id"])

    def _measure(self, item: JsonDict) -> None:
        size = len(json.dumps(item, separators=(",", ":")))
        self._chars += size - self._sizes.get(item["id"], 0)
        self._sizes[item["id"]] = size

    def get(self, item_id: str) -> JsonDict | None:
        return self._items.get(item_id)

    def remove(self, item_id: str) -> None:
        self._items.pop(item_id, None)
        self._chars -= self._sizes.pop(item_id, 0)
        self._busy.discard(item_id)

    def busy(self, item_id: str) -> bool:
        return item_id in self._busy


class ItemPlacement:
    """Places items in the log and remembers the item before each until its
    ``conversation.item.done`` is told: that event names it again, after
    the log may have moved on."""

    def __init__(self, log: ItemLog) -> None:
        self.log = log
        self._previous: dict[str, str | None] = {}  # item_id -> the item before it

    def place(self, item: JsonDict, busy: bool = False) -> str | None:
        """Append an item to the client's view of the conversation."""
        previous = self.log.place(item, busy)
        self._previous[item["id"]] = previous
        return previous

    def done(self, item_id: str) -> str | None:
        """The item before this one, forgotten once its item.done is told."""
        return self._previous.pop(item_id, None)


class ItemEvents:
    def __init__(
        self, session: VoiceSession, log: ItemLog, send: Callable[[JsonDict], None]
    ) -> None:
        self.session = session
        self.log = log
        self._send = send

    def handlers(self) -> dict[str, Callable[[JsonDict], None]]:
        return {
            "conversation.item.retrieve": self.retrieve,
            "conversation.item.delete": self.delete,
            "conversation.item.truncate": self.truncate,
        }

    def _find(self, event: JsonDict) -> tuple[str, JsonDict]:
        item_id = event.get("item_id")
        if not isinstance(item_id, str) or not item_id:
            raise ClientEventError("invalid_value", "item_id must be a string", "item_id")
        item = self.log.get(item_id)
        if item is None:
            raise ClientEventError(
                "item_not_found", f"no item {item_id!r} in the conversation", "item_id"
            )
        return item_id, item

    def retrieve(self, event: JsonDict) -> None:
        _, item = self._find(event)
        self._send({"type": "conversation.item.retrieved", "item": item})

    def delete(self, event: JsonDict) -> None:
        item_id, item = self._find(event)
        if self.log.busy(item_id):
            raise ClientEventError(
                "item_in_progress",
                f"item {item_id!r} is still being transcribed or generated; "
                "delete it once it is done (conversation.item.done)",
                "item_id",
            )
        if item.get("type") == "function_call":
            self.session.delete_function_call(str(item.get("call_id")))
        else:
            self.session.delete_item(item_id)
        self.log.remove(item_id)
        self._send({"type": "conversation.item.deleted", "item_id": item_id})

    def truncate(self, event: JsonDict) -> None:
        item_id, item = self._find(event)
        content_index = event.get("content_index", 0)
        if content_index != 0 or isinstance(content_index, bool):
            raise ClientEventError(
                "invalid_value",
                "content_index must be 0 (an audio message's only part)",
                "content_index",
            )
        audio_end_ms = event.get("audio_end_ms")
        if not isinstance(audio_end_ms, int) or isinstance(audio_end_ms, bool) or audio_end_ms < 0:
            raise ClientEventError(
                "invalid_value", "audio_end_ms must be an integer of at least 0", "audio_end_ms"
            )
        if self.log.busy(item_id):
            raise ClientEventError(
                "item_in_progress",
                f"item {item_id!r} is still in progress; cancel the response "
                "(response.cancel) or truncate it once it is done",
                "item_id",
            )
        content = item.get("content") or [{}]
        if item.get("role") != "assistant" or content[0].get("type") != "output_audio":
            raise ClientEventError(
                "invalid_value", "only an assistant's audio message can be truncated", "item_id"
            )
        try:
            kept = self.session.truncate_item(item_id, audio_end_ms)
        except ItemError as exc:
            raise ClientEventError("invalid_value", str(exc), "audio_end_ms") from None
        self.log.update({**item, "content": [{**content[0], "transcript": kept}]})
        self._send(
            {
                "type": "conversation.item.truncated",
                "item_id": item_id,
                "content_index": 0,
                "audio_end_ms": audio_end_ms,
            }
        )
