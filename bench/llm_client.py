"""What the LLM client itself costs, and how fast it fails.

Against the scripted OpenAI-wire peer (voice_agent/testing/scripted_llm.py, loopback, no
model): time to first output and to the end of a 200-token reply for both
APIs, assembling parallel tool calls, the spoken-text filter's throughput,
how long until a dead endpoint or a hung one is reported, and how long
until the server sees a cancelled stream's disconnect. Against the embedded
llama.cpp server: time to first token and to the end of a 32-token reply.

    .venv/bin/python bench/llm_client.py            # 20 rounds each
    .venv/bin/python bench/llm_client.py --rounds 50

The same scenarios through OpenAI's own SDK (``openai.AsyncOpenAI``,
streaming chat completions) are measured beside ours in the same run: the
figures the choice between the two clients rests on.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from voice_agent.backends.base import ChatMessage, LlmError
from voice_agent.backends.llm.chat_completions import OpenAIChatLlm
from voice_agent.backends.llm.http_client import HttpLlmConfig
from voice_agent.backends.llm.llama_server import EmbeddedLlamaServer, default_model_path
from voice_agent.stages.text_filter import SpokenTextFilter
from voice_agent.testing.figures import percentile
from voice_agent.testing.ports import free_port
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    call_events,
    make_llm,
    scripted_llm_server,
    text_events,
)

MESSAGES = [ChatMessage("system", "Be brief."), ChatMessage("user", "Tell me a story.")]
TOKENS = [f"word{i} " for i in range(200)]

Row = tuple[str, list[float]]


async def timed_stream(api: str, peer: ScriptedLlmServer) -> tuple[float, float]:
    llm = make_llm(api, peer.base_url)
    try:
        started = time.perf_counter()
        first = 0.0
        async for _ in llm.stream_reply(MESSAGES, 300, 0.5):
            first = first or time.perf_counter() - started
        return first * 1000, (time.perf_counter() - started) * 1000
    finally:
        await llm.aclose()


async def scripted_rows(rounds: int) -> list[Row]:
    rows: list[Row] = []
    async with scripted_llm_server() as peer:
        for api in ("chat-completions", "responses"):
            first, total = [], []
            for _ in range(rounds):
                peer.add(Script(text_events(api, *TOKENS)))
                f, t = await timed_stream(api, peer)
                first.append(f)
                total.append(t)
            rows += [(f"{api}: first output", first), (f"{api}: 200 tokens, all", total)]
            calls = [(f"call_{i}", "get_weather", '{"city": "' + "x" * 100 + '"}') for i in (1, 2)]
            tool: list[float] = []
            for _ in range(rounds):
                peer.add(Script(call_events(api, *calls)))
                tool.append((await timed_stream(api, peer))[1])
            rows.append((f"{api}: 2 parallel calls, 70 fragments", tool))
        cancel: list[float] = []
        for _ in range(rounds):
            peer.add(Script(text_events("chat-completions", "One, ", "two."), hang_after=2))
            peer.disconnected.clear()
            llm = make_llm("chat-completions", peer.base_url, read_timeout_s=30)
            stream = llm.stream_reply(MESSAGES, 50, 0.5)
            await anext(stream)
            started = time.perf_counter()
            await stream.aclose()  # type: ignore[attr-defined]
            await peer.disconnected.wait()
            cancel.append((time.perf_counter() - started) * 1000)
            await llm.aclose()
        rows.append(("cancel -> upstream sees the disconnect", cancel))
    return rows


async def sdk_rows(rounds: int) -> list[Row]:
    """OpenAI's SDK on the same peer: first output, a whole reply, and how
    long until the peer sees a closed stream's disconnect."""
    from openai import AsyncOpenAI

    rows: list[Row] = []
    async with scripted_llm_server() as peer:
        client = AsyncOpenAI(base_url=peer.base_url, api_key="x", max_retries=0)
        first, total, cancel = [], [], []
        messages: list[Any] = [{"role": m.role, "content": m.content} for m in MESSAGES]
        for _ in range(rounds):
            peer.add(Script(text_events("chat-completions", *TOKENS)))
            started = time.perf_counter()
            f = 0.0
            stream = await client.chat.completions.create(
                model="m", messages=messages, max_tokens=300, stream=True
            )
            async for _chunk in stream:
                f = f or time.perf_counter() - started
            first.append(f * 1000)
            total.append((time.perf_counter() - started) * 1000)
        for _ in range(rounds):
            peer.add(Script(text_events("chat-completions", "One, ", "two."), hang_after=2))
            peer.disconnected.clear()
            stream = await client.chat.completions.create(
                model="m", messages=messages, max_tokens=50, stream=True
            )
            await anext(aiter(stream))
            started = time.perf_counter()
            await stream.close()
            await peer.disconnected.wait()
            cancel.append((time.perf_counter() - started) * 1000)
        await client.close()
    rows += [
        ("openai SDK chat-completions: first output", first),
        ("openai SDK chat-completions: 200 tokens, all", total),
        ("openai SDK: cancel -> upstream sees the disconnect", cancel),
    ]
    return rows


async def failure_rows(rounds: int) -> list[Row]:
    async def fails(make: Callable[[], Awaitable[None]]) -> float:
        started = time.perf_counter()
        try:
            await make()
        except LlmError:
            return (time.perf_counter() - started) * 1000
        raise AssertionError("expected an LlmError")

    async def dead() -> None:
        llm = make_llm("chat-completions", f"http://127.0.0.1:{free_port()}/v1", retries=2)
        try:
            async for _ in llm.stream_reply(MESSAGES, 10, 0.5):
                pass
        finally:
            await llm.aclose()

    dead_ms = [await fails(dead) for _ in range(rounds)]
    async with scripted_llm_server() as peer:

        async def hung() -> None:
            peer.add(Script(hang_before=True), Script(hang_before=True))
            llm = make_llm("chat-completions", peer.base_url, retries=1, first_token_timeout_s=0.5)
            try:
                async for _ in llm.stream_reply(MESSAGES, 10, 0.5):
                    pass
            finally:
                await llm.aclose()

        hung_ms = [await fails(hung) for _ in range(min(rounds, 5))]
    return [
        ("dead endpoint -> error (2 retries, 0.05 s backoff)", dead_ms),
        ("hung endpoint -> error (0.5 s first-token timeout, 1 retry)", hung_ms),
    ]


def filter_row(rounds: int) -> Row:
    text = "<think>plan the answer</think>" + "**Sure**, here is [a link](http://x) 😀. " * 50
    deltas = [text[i : i + 4] for i in range(0, len(text), 4)]
    times: list[float] = []
    for _ in range(rounds):
        spoken = SpokenTextFilter()
        started = time.perf_counter()
        for delta in deltas:
            spoken.push(delta)
        spoken.flush()
        times.append((time.perf_counter() - started) * 1e6 / len(deltas))
    return ("text filter, per 4-char delta (us)", times)


async def llama_rows(rounds: int) -> list[Row]:
    server = EmbeddedLlamaServer(default_model_path(), threads=2, ctx=2048)
    await server.start()
    llm = OpenAIChatLlm(HttpLlmConfig(server.base_url, None, "bench"))
    first, total = [], []
    try:
        for i in range(rounds):
            messages = [ChatMessage("user", f"Tell me fact number {i} about the sea.")]
            started = time.perf_counter()
            f = 0.0
            async for _ in llm.stream_reply(messages, 32, 0.0):
                f = f or time.perf_counter() - started
            first.append(f * 1000)
            total.append((time.perf_counter() - started) * 1000)
    finally:
        await llm.aclose()
        await server.stop()
    return [("embedded llama: first token", first), ("embedded llama: 32 tokens", total)]


def table(rows: list[Row]) -> str:
    lines = [
        f"| {'scenario':<62} | {'p50 ms':>8} | {'p90 ms':>8} | {'n':>3} |",
        f"|{'-' * 64}|{'-' * 10}|{'-' * 10}|{'-' * 5}|",
    ]
    for name, values in rows:
        p90 = percentile(values, 90)
        lines.append(
            f"| {name:<62} | {statistics.median(values):>8.2f} | {p90:>8.2f} | {len(values):>3} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--no-llama", action="store_true", help="skip the embedded server")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # retries are expected here: keep the table clean
    rows = await scripted_rows(args.rounds)
    rows += await sdk_rows(args.rounds)
    rows += await failure_rows(args.rounds)
    rows.append(filter_row(args.rounds))
    if not args.no_llama:
        rows += await llama_rows(args.rounds)
    print(table(rows))


if __name__ == "__main__":
    asyncio.run(main())
