"""The embedded llama.cpp server is supervised: killed, it comes back where
its clients expect it."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from voice_agent.backends.base import ChatMessage
from voice_agent.backends.llama_server import (
    EmbeddedLlamaServer,
    default_model_path,
    find_llama_server,
)
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


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead: only its parent has yet to read its status.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


async def test_a_wrapper_commands_server_goes_with_it_on_a_restart_and_at_stop() -> None:
    """--llama-server-command may be a wrapper: a shell that starts the server
    and waits. The death signal reaches only the wrapper, so the supervisor
    must stop the server it started too, or a restart finds the port taken
    and the stopped service leaves a server running."""
    wrapper = ["sh", "-c", '"$0" "$@" & wait', str(find_llama_server())]
    arguments = "--model {model} --host {host} --port {port} --ctx-size {ctx} --threads {threads}"
    server = EmbeddedLlamaServer(
        default_model_path(), threads=1, ctx=512, command=[*wrapper, *arguments.split()]
    )
    started: list[int] = []
    await server.start()
    llm = OpenAIChatLlm(HttpLlmConfig(server.base_url, None, "test", first_token_timeout_s=30))
    try:
        assert server._process is not None
        (first,) = children(server._process.pid)
        started.append(first)
        assert await reply(llm)
        server._process.send_signal(signal.SIGKILL)  # the wrapper dies, its server would not
        async with asyncio.timeout(60):
            # Observing another process restart: nothing to await but time.
            while server.restarts == 0 or not server.running:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert not alive(first)
        (second,) = children(server._process.pid)
        started.append(second)
        assert await reply(llm)
    finally:
        await llm.aclose()
        await server.stop()
        left = [pid for pid in started if alive(pid)]
        for pid in left:  # a failed run must not leave them behind either
            os.kill(pid, signal.SIGKILL)
    assert left == []
