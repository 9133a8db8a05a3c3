"""The embedded llama.cpp server is supervised: killed, it comes back where
its clients expect it."""

from __future__ import annotations

import asyncio
import signal

from voice_agent.backends.base import ChatMessage
from voice_agent.backends.llama_server import EmbeddedLlamaServer, default_model_path
from voice_agent.backends.llm_http import HttpLlmConfig
from voice_agent.backends.llm_openai import OpenAIChatLlm


async def reply(llm: OpenAIChatLlm) -> str:
    parts = [d async for d in llm.stream_reply([ChatMessage("user", "Say hi.")], 4, 0.0)]
    return "".join(p for p in parts if isinstance(p, str))


async def test_a_killed_server_is_restarted_on_the_same_port() -> None:
    server = EmbeddedLlamaServer(default_model_path(), threads=1, ctx=512)
    await server.start()
    llm = OpenAIChatLlm(HttpLlmConfig(server.base_url, None, "test", first_token_timeout_s=30))
    try:
        assert await reply(llm)
        url = server.base_url
        process = server._process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        async with asyncio.timeout(60):
            # Observing another process restart: nothing to await but time.
            while server.restarts == 0 or not server.running:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert server.base_url == url
        assert await reply(llm)
    finally:
        await llm.aclose()
        await server.stop()
    assert not server.running
