"""``response.create``: the options of one reply, read into the session's
``ResponseRequest``. ``conversation: "none"`` makes it out of band (the
history never sees it); ``input`` gives the items it answers instead of the
history (messages, or references to items the conversation holds);
``metadata`` is told back on its response events."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Any

from voice_agent.backends.base import ChatMessage
from voice_agent.realtime import tool_items
from voice_agent.realtime.errors import ClientEventError
from voice_agent.realtime.params import (
    check_format,
    check_keys,
    check_voice,
    object_at,
    parse_modalities,
    require_unset,
    unsupported,
)
from voice_agent.session.session import ResponseRequest

JsonDict = dict[str, Any]
MAX_INPUT_ITEMS = 256
# The words of a reply's input, references resolved: no more than one event
# could carry itself (client_events.MAX_CLIENT_EVENT_BYTES). A reference
# repeats an item's words without their bytes (one 250 KiB item referenced
# 256 times made a 62 MiB LLM request).
MAX_INPUT_CHARS = 256 * 1024
# OpenAI's limits on metadata.
MAX_METADATA_KEYS = 16
MAX_METADATA_KEY = 64
MAX_METADATA_VALUE = 512

_KEYS = (
    "instructions",
    "max_output_tokens",
    "conversation",
    "metadata",
    "input",
    "output_modalities",
    "audio",
    "tools",
    "tool_choice",
    "prompt",
    "reasoning",
    "parallel_tool_calls",
)
# Content parts whose words a message item carries, by role.
_TEXT_PARTS = {
    "user": {"input_text": "text", "input_audio": "transcript"},
    "system": {"input_text": "text"},
    "assistant": {"output_text": "text", "text": "text", "output_audio": "transcript"},
}


def parse_response_options(
    options: JsonDict,
    voices: Sequence[str],
    server_tools: Collection[str],
    token_cap: int,
    item_message: Callable[[str], ChatMessage | None],
) -> ResponseRequest:
    check_keys(options, _KEYS, "response")
    instructions = options.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ClientEventError(
            "invalid_type", "instructions must be a string", "response.instructions"
        )
    max_tokens = (
        tool_items.parse_max_tokens(
            options["max_output_tokens"], "response.max_output_tokens", token_cap
        )
        if options.get("max_output_tokens") is not None
        else None
    )
    conversation = options.get("conversation")
    if conversation not in (None, "auto", "none"):
        raise unsupported(
            "response.conversation", "only 'auto' (the session's conversation) or 'none'"
        )
    audio = None
    if options.get("output_modalities") is not None:
        audio = parse_modalities(options["output_modalities"], "response.output_modalities")
    voice = None
    if options.get("audio") is not None:
        voice = _parse_audio(object_at(options["audio"], "response.audio"), voices)
    tools = (
        tuple(tool_items.parse_tools(options["tools"], server_tools, "response.tools"))
        if options.get("tools") is not None
        else None
    )
    tool_choice = (
        tool_items.parse_tool_choice(options["tool_choice"], "response.tool_choice")
        if options.get("tool_choice") is not None
        else None
    )
    require_unset(options.get("prompt"), "response.prompt", "stored prompts are not supported")
    require_unset(options.get("reasoning"), "response.reasoning", "set with --llm-reasoning-effort")
    require_unset(
        options.get("parallel_tool_calls"),
        "response.parallel_tool_calls",
        "the model may always call several tools at once",
        (True,),
    )
    context = (
        _parse_input(options["input"], item_message) if options.get("input") is not None else None
    )
    return ResponseRequest(
        instructions=instructions,
        max_output_tokens=max_tokens,
        in_conversation=conversation != "none",
        context=context,
        metadata=_parse_metadata(options.get("metadata")),
        audio=audio,
        tools=tools,
        tool_choice=tool_choice,
        voice=voice,
    )


def _parse_audio(audio: JsonDict, voices: Sequence[str]) -> str | None:
    """The reply's voice, when it names one (None: the session's)."""
    check_keys(audio, ("output",), "response.audio")
    if audio.get("output") is None:
        return None
    output = object_at(audio["output"], "response.audio.output")
    check_keys(output, ("format", "voice"), "response.audio.output")
    check_format(output.get("format"), "response.audio.output.format")
    if output.get("voice") is None:
        return None
    return check_voice(output["voice"], "response.audio.output.voice", voices)


def _parse_metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if (
        not isinstance(value, dict)
        or len(value) > MAX_METADATA_KEYS
        or not all(
            isinstance(k, str)
            and isinstance(v, str)
            and len(k) <= MAX_METADATA_KEY
            and len(v) <= MAX_METADATA_VALUE
            for k, v in value.items()
        )
    ):
        raise ClientEventError(
            "invalid_value",
            f"metadata must map at most {MAX_METADATA_KEYS} keys (up to {MAX_METADATA_KEY} "
            f"characters) to strings (up to {MAX_METADATA_VALUE})",
            "response.metadata",
        )
    return dict(value)


def _parse_input(
    value: Any, item_message: Callable[[str], ChatMessage | None]
) -> tuple[ChatMessage, ...]:
    if not isinstance(value, list) or len(value) > MAX_INPUT_ITEMS:
        raise ClientEventError(
            "invalid_value",
            f"input must be a list of at most {MAX_INPUT_ITEMS} items",
            "response.input",
        )
    messages: list[ChatMessage] = []
    for index, item in enumerate(value):
        where = f"response.input[{index}]"
        given = object_at(item, where)
        kind = given.get("type")
        if kind == "item_reference":
            item_id = given.get("id")
            message = item_message(item_id) if isinstance(item_id, str) else None
            if message is None:
                raise ClientEventError(
                    "item_not_found",
                    f"no item {item_id!r} in the conversation",
                    f"{where}.id",
                )
            messages.append(message)
        elif kind == "message":
            messages.append(_message(given, where))
        else:
            raise unsupported(f"{where}.type", "only message and item_reference items")
    size = sum(len(m.content) + sum(len(c.arguments) for c in m.tool_calls) for m in messages)
    if size > MAX_INPUT_CHARS:
        raise ClientEventError(
            "input_too_large",
            f"the input's items hold {size} characters (their references counted each "
            f"time); at most {MAX_INPUT_CHARS}",
            "response.input",
        )
    return tuple(messages)


def _message(item: JsonDict, where: str) -> ChatMessage:
    role = item.get("role")
    parts = _TEXT_PARTS.get(role) if isinstance(role, str) else None
    if parts is None:
        raise ClientEventError(
            "invalid_value", "role must be user, assistant or system", f"{where}.role"
        )
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise ClientEventError(
            "invalid_value", "a message needs a list of content parts", f"{where}.content"
        )
    texts: list[str] = []
    for index, part in enumerate(content):
        param = f"{where}.content[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        field = parts.get(kind) if isinstance(kind, str) else None
        text = part.get(field) if field is not None and isinstance(part, dict) else None
        if not isinstance(text, str):
            raise ClientEventError(
                "invalid_value",
                f"a {role} message's parts must be {' or '.join(parts)} with their text",
                param,
            )
        texts.append(text)
    assert isinstance(role, str)
    return ChatMessage(role, " ".join(t.strip() for t in texts if t.strip()))
