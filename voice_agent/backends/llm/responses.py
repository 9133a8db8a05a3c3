"""Any OpenAI-compatible Responses endpoint (``POST /responses``), streamed.

Stateless use of the API (``store: false``, the whole conversation sent each
turn), so it works the same against OpenAI, the Hugging Face router and
vLLM. A function call is one output item: it is yielded when its
``response.output_item.done`` arrives (or, failing that, at the end).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

from voice_agent.backends.base import ChatMessage, LlmError, ToolCall, ToolChoice, ToolSpec
from voice_agent.backends.llm.http_client import (
    REPORTED_ERROR,
    HttpLlmClient,
    HttpLlmConfig,
    Output,
)


class ResponsesStreamParser:
    def __init__(self) -> None:
        # item id -> [call_id, name, argument fragments]; only calls not yet yielded.
        self._calls: dict[str, tuple[str, str, list[str]]] = {}
        self._order: list[str] = []
        self.progressed = False

    def feed(self, event: dict[str, Any]) -> Iterable[Output]:
        kind = event.get("type")
        if isinstance(kind, str) and (
            kind.startswith("response.reasoning") or kind.startswith("response.function_call")
        ):
            self.progressed = True
        if kind == "response.output_text.delta":
            delta = event.get("delta")
            return [delta] if isinstance(delta, str) and delta else []
        if kind == "response.output_item.added":
            item = event.get("item") or {}
            if item.get("type") == "function_call":
                self.progressed = True
                key = str(item.get("id") or item.get("call_id") or len(self._order))
                call_id = item.get("call_id") or f"call_{uuid.uuid4().hex[:24]}"
                self._calls[key] = (call_id, item.get("name") or "", [])
                self._order.append(key)
            return []
        if kind == "response.function_call_arguments.delta":
            call = self._calls.get(str(event.get("item_id")))
            if call is not None and isinstance(event.get("delta"), str):
                call[2].append(event["delta"])
            return []
        if kind == "response.output_item.done":
            item = event.get("item") or {}
            if item.get("type") != "function_call":
                return []
            key = str(item.get("id") or item.get("call_id"))
            call_id, name, fragments = self._calls.pop(key, (item.get("call_id") or "", "", []))
            if key in self._order:
                self._order.remove(key)
            arguments = item.get("arguments") or "".join(fragments) or "{}"
            return [ToolCall(item.get("call_id") or call_id, item.get("name") or name, arguments)]
        if kind in ("error", "response.failed"):
            error = event.get("error") or (event.get("response") or {}).get("error") or {}
            message = error.get("message") if isinstance(error, dict) else error
            raise LlmError(
                "stream_error", f"the LLM reported an error: {message or kind}", REPORTED_ERROR
            )
        return []  # reasoning deltas, lifecycle events: never spoken

    def finish(self) -> Iterable[Output]:
        calls: list[Output] = []
        for key in self._order:
            call_id, name, fragments = self._calls[key]
            if name:
                calls.append(ToolCall(call_id, name, "".join(fragments) or "{}"))
        self._calls.clear()
        self._order.clear()
        return calls


def input_items(messages: list[ChatMessage]) -> tuple[str | None, list[dict[str, Any]]]:
    """The leading system message becomes ``instructions``; the rest are items."""
    instructions: str | None = None
    rest = messages
    if messages and messages[0].role == "system":
        instructions, rest = messages[0].content, messages[1:]
    items: list[dict[str, Any]] = []
    for message in rest:
        if message.role == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message.tool_call_id,
                    "output": message.content,
                }
            )
            continue
        if message.content or not message.tool_calls:
            items.append({"role": message.role, "content": message.content})
        for call in message.tool_calls:
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                }
            )
    return instructions, items


def responses_tool_choice(choice: ToolChoice) -> Any:
    if isinstance(choice, dict):
        return {"type": "function", "name": choice.get("name", "")}
    return choice


class OpenAIResponsesLlm:
    name = "responses"

    def __init__(self, config: HttpLlmConfig) -> None:
        self._client = HttpLlmClient(config)
        self.model = config.model

    def request_body(
        self,
        messages: list[ChatMessage],
        max_tokens: int,
        temperature: float,
        tools: Sequence[ToolSpec],
        tool_choice: ToolChoice,
    ) -> dict[str, Any]:
        instructions, items = input_items(messages)
        body: dict[str, Any] = {
            "model": self.model,
            "input": items,
            "max_output_tokens": max_tokens,
            **self._client.sampling_fields(temperature),
            "stream": True,
            "store": False,
            **self._client.reasoning_fields(responses_api=True),
        }
        if instructions is not None:
            body["instructions"] = instructions
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": t.name,
                    "description": t.description,
                    "parameters": t.parameters,
                }
                for t in tools
            ]
            body["tool_choice"] = responses_tool_choice(tool_choice)
        return body

    def stream_reply(
        self,
        messages: list[ChatMessage],
        max_tokens: int,
        temperature: float,
        tools: Sequence[ToolSpec] = (),
        tool_choice: ToolChoice = "auto",
    ) -> AsyncIterator[str | ToolCall]:
        body = self.request_body(messages, max_tokens, temperature, tools, tool_choice)
        return self._client.stream("/responses", body, ResponsesStreamParser)

    async def prefill(self, messages: list[ChatMessage], tools: Sequence[ToolSpec] = ()) -> None:
        # OpenAI's minimum output is 16 tokens; prefill is off by default for
        # remote endpoints anyway (it is billed).
        async for _ in self.stream_reply(messages, 16, 0.0, tools):
            pass

    async def aclose(self) -> None:
        await self._client.aclose()
