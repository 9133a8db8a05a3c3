"""Any OpenAI-compatible Chat Completions endpoint (``POST /chat/completions``), streamed.

vLLM, llama.cpp's server, Ollama, OpenAI and the Hugging Face router all
speak this. Tool calls arrive as fragments keyed by ``index`` (the id and
name in the first, the arguments spread over the rest); they are assembled
here and yielded whole once the stream says the message is finished.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from voice_agent.backends.base import ChatMessage, LlmError, ToolCall, ToolChoice, ToolSpec
from voice_agent.backends.llm.http_client import (
    REPORTED_ERROR,
    HttpLlmClient,
    HttpLlmConfig,
    Output,
)


@dataclass
class _Fragments:
    call_id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ChatStreamParser:
    def __init__(self) -> None:
        self._calls: dict[int, _Fragments] = {}
        self.progressed = False

    def feed(self, event: dict[str, Any]) -> Iterable[Output]:
        error = event.get("error")
        if error:
            message = error.get("message") if isinstance(error, dict) else error
            raise LlmError("stream_error", f"the LLM reported an error: {message}", REPORTED_ERROR)
        outputs: list[Output] = []
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            # vLLM and llama.cpp stream thinking as reasoning_content, OpenRouter as reasoning.
            if delta.get("tool_calls") or delta.get("reasoning_content") or delta.get("reasoning"):
                self.progressed = True
            content = delta.get("content")
            if isinstance(content, str) and content:
                outputs.append(content)
            for fragment in delta.get("tool_calls") or []:
                index = fragment.get("index", len(self._calls))
                call = self._calls.setdefault(index, _Fragments())
                call.call_id = fragment.get("id") or call.call_id
                function = fragment.get("function") or {}
                call.name += function.get("name") or ""
                if function.get("arguments"):
                    call.arguments.append(function["arguments"])
            if choice.get("finish_reason"):
                outputs.extend(self._complete())
        return outputs

    def finish(self) -> Iterable[Output]:
        return self._complete()

    def _complete(self) -> list[Output]:
        calls: list[Output] = [
            ToolCall(c.call_id or _call_id(), c.name, "".join(c.arguments) or "{}")
            for _, c in sorted(self._calls.items())
            if c.name
        ]
        self._calls.clear()
        return calls


def chat_message(message: ChatMessage) -> dict[str, Any]:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.tool_call_id, "content": message.content}
    body: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        body["tool_calls"] = [
            {
                "id": call.call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in message.tool_calls
        ]
    return body


def chat_tool_choice(choice: ToolChoice) -> Any:
    if isinstance(choice, dict):
        return {"type": "function", "function": {"name": choice.get("name", "")}}
    return choice


class OpenAIChatLlm:
    name = "chat-completions"

    def __init__(self, config: HttpLlmConfig) -> None:
        self._client = HttpLlmClient(config)
        self.model = config.model
        # OpenAI's reasoning models refuse ``max_tokens``; most other servers
        # only know ``max_tokens``.
        host = urlparse(config.base_url).hostname or ""
        self._max_tokens_field = (
            "max_completion_tokens" if host.endswith("api.openai.com") else "max_tokens"
        )

    def request_body(
        self,
        messages: list[ChatMessage],
        max_tokens: int,
        temperature: float,
        tools: Sequence[ToolSpec],
        tool_choice: ToolChoice,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [chat_message(m) for m in messages],
            self._max_tokens_field: max_tokens,
            **self._client.sampling_fields(temperature),
            "stream": True,
            **self._client.reasoning_fields(responses_api=False),
        }
        if tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.parameters,
                    },
                }
                for t in tools
            ]
            body["tool_choice"] = chat_tool_choice(tool_choice)
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
        return self._client.stream("/chat/completions", body, ChatStreamParser)

    async def prefill(self, messages: list[ChatMessage], tools: Sequence[ToolSpec] = ()) -> None:
        """A one-token request: servers with prefix caching (llama.cpp, vLLM)
        keep the prompt's state, so the next request only processes what is new."""
        async for _ in self.stream_reply(messages, 1, 0.0, tools):
            pass

    async def aclose(self) -> None:
        await self._client.aclose()
