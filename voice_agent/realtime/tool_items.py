"""Realtime wire shapes for tools and client-created items: parsing the
``tools`` / ``tool_choice`` / ``max_output_tokens`` of ``session.update``,
the items of ``conversation.item.create``, and the server events that hand
a function call to the client."""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from voice_agent.backends.base import ToolChoice, ToolSpec
from voice_agent.realtime.errors import ClientEventError
from voice_agent.session.events import FunctionCallRequested

JsonDict = dict[str, Any]
MAX_TOOLS = 128
MAX_OUTPUT_TOKENS = 4096
# What OpenAI accepts as a function name; other servers are no more lenient.
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def parse_tools(
    value: Any, server_tools: Collection[str] = (), where: str = "session.tools"
) -> list[ToolSpec]:
    """The client's function tools; a name the server's own tools (or an
    earlier entry) already use is refused: the model would see both and a
    call could only ever reach one of them."""
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise ClientEventError(
            "invalid_value", f"tools must be a list of at most {MAX_TOOLS}", where
        )
    tools: list[ToolSpec] = []
    for index, tool in enumerate(value):
        param = f"{where}[{index}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise ClientEventError("invalid_value", "only function tools are supported", param)
        name, description = tool.get("name"), tool.get("description", "")
        parameters = tool.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
            raise ClientEventError(
                "invalid_value",
                "a tool needs a name of 1-64 letters, digits, _ or -",
                param + ".name",
            )
        if name in server_tools or any(t.name == name for t in tools):
            owner = "a server tool" if name in server_tools else "another tool in this list"
            raise ClientEventError(
                "invalid_value", f"tool name {name!r} is already used by {owner}", param + ".name"
            )
        if not isinstance(description, str) or not isinstance(parameters, dict):
            raise ClientEventError(
                "invalid_type", "description must be a string, parameters an object", param
            )
        tools.append(ToolSpec(name, description, parameters))
    return tools


def tools_json(tools: list[ToolSpec]) -> list[JsonDict]:
    return [
        {
            "type": "function",
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
        }
        for t in tools
    ]


def parse_tool_choice(value: Any, param: str) -> ToolChoice:
    if value in ("auto", "none", "required"):
        return str(value)
    if isinstance(value, dict) and value.get("type") == "function":
        name = value.get("name")
        if isinstance(name, str) and name:
            return {"type": "function", "name": name}
    raise ClientEventError(
        "invalid_value",
        "tool_choice must be auto, none, required or {type: function, name}",
        param,
    )


def parse_max_tokens(value: Any, param: str, unlimited: int) -> int:
    """An integer, or "inf"; never more than ``unlimited``, the server's cap
    (``--llm-max-tokens``): the operator's ceiling is no client's to raise."""
    if value == "inf":
        return unlimited
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_OUTPUT_TOKENS:
        raise ClientEventError(
            "invalid_value",
            f"max_output_tokens must be an integer from 1 to {MAX_OUTPUT_TOKENS} or 'inf'",
            param,
        )
    return min(value, unlimited)


@dataclass(frozen=True)
class UserText:
    item_id: str
    text: str

    def json(self) -> JsonDict:
        return {
            "id": self.item_id,
            "object": "realtime.item",
            "type": "message",
            "status": "completed",
            "role": "user",
            "content": [{"type": "input_text", "text": self.text}],
        }


@dataclass(frozen=True)
class FunctionOutput:
    item_id: str
    call_id: str
    output: str

    def json(self) -> JsonDict:
        return {
            "id": self.item_id,
            "object": "realtime.item",
            "type": "function_call_output",
            "status": "completed",
            "call_id": self.call_id,
            "output": self.output,
        }


def parse_item(item: Any, default_id: str) -> UserText | FunctionOutput:
    """A ``conversation.item.create`` item this server accepts."""
    if not isinstance(item, dict):
        raise ClientEventError("invalid_value", "'item' must be an object", "item")
    raw_id = item.get("id")
    item_id = raw_id if isinstance(raw_id, str) and raw_id else default_id
    item_type = item.get("type")
    if item_type == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not call_id:
            raise ClientEventError("invalid_value", "call_id must be a string", "item.call_id")
        if not isinstance(output, str):
            raise ClientEventError("invalid_type", "output must be a string", "item.output")
        return FunctionOutput(item_id, call_id, output)
    if item_type == "message" and item.get("role") == "user":
        content = item.get("content")
        texts = [
            part.get("text")
            for part in content or []
            if isinstance(part, dict) and part.get("type") == "input_text"
        ]
        if not isinstance(content, list) or not texts:
            raise ClientEventError(
                "invalid_value",
                "a user message needs content parts of type input_text",
                "item.content",
            )
        if not all(isinstance(t, str) for t in texts):
            raise ClientEventError("invalid_type", "text must be a string", "item.content")
        return UserText(item_id, " ".join(t for t in texts if isinstance(t, str)).strip())
    raise ClientEventError(
        "invalid_value",
        "supported items: function_call_output, or a user message of input_text",
        "item.type",
    )


def function_call_item(event: FunctionCallRequested, status: str) -> JsonDict:
    return {
        "id": event.item_id,
        "object": "realtime.item",
        "type": "function_call",
        "status": status,
        "call_id": event.call_id,
        "name": event.name,
        "arguments": event.arguments if status == "completed" else "",
    }


def function_call_events(
    event: FunctionCallRequested, output_index: int, previous: str | None
) -> list[JsonDict]:
    """Everything the client is told about one function call, in order."""
    added = function_call_item(event, "in_progress")
    done = function_call_item(event, "completed")
    ref = {
        "response_id": event.response_id,
        "item_id": event.item_id,
        "output_index": output_index,
        "call_id": event.call_id,
    }
    return [
        {
            "type": "response.output_item.added",
            "response_id": event.response_id,
            "output_index": output_index,
            "item": added,
        },
        {"type": "conversation.item.added", "previous_item_id": previous, "item": added},
        {"type": "response.function_call_arguments.delta", **ref, "delta": event.arguments},
        {
            "type": "response.function_call_arguments.done",
            **ref,
            "name": event.name,
            "arguments": event.arguments,
        },
        {
            "type": "response.output_item.done",
            "response_id": event.response_id,
            "output_index": output_index,
            "item": done,
        },
        {"type": "conversation.item.done", "previous_item_id": previous, "item": done},
    ]
