"""Any OpenAI-compatible Chat Completions endpoint, streamed.

vLLM, llama.cpp's server, Ollama, OpenAI and the Hugging Face router all
speak this. The request is aborted (its HTTP stream closed) as soon as the
consumer stops iterating, so a barge-in stops generation upstream too.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

from voice_agent.backends.base import ChatMessage


class OpenAIChatLlm:
    name = "chat-completions"

    def __init__(self, base_url: str, api_key: str | None, model: str, timeout_s: float) -> None:
        # The SDK insists on a key; local servers ignore it.
        self._client = AsyncOpenAI(
            base_url=base_url, api_key=api_key or "not-needed", timeout=timeout_s, max_retries=1
        )
        self.model = model

    async def stream_reply(
        self, messages: list[ChatMessage], max_tokens: int, temperature: float
    ) -> AsyncIterator[str]:
        stream = await self._client.chat.completions.create(
            model=self.model,
            messages=cast(
                list[ChatCompletionMessageParam],
                [{"role": m.role, "content": m.content} for m in messages],
            ),
            max_tokens=max_tokens,
            temperature=temperature,
            stream=True,
        )
        try:
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    yield chunk.choices[0].delta.content
        finally:
            await stream.close()

    async def prefill(self, messages: list[ChatMessage]) -> None:
        """A one-token request: servers with prefix caching (llama.cpp, vLLM)
        keep the prompt's state, so the next request only processes what is new."""
        async for _ in self.stream_reply(messages, max_tokens=1, temperature=0.0):
            pass

    async def aclose(self) -> None:
        await self._client.close()
