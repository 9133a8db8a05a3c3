"""The embedded llama-server serves many sessions at once: concurrent
requests are decoded together and none interrupts another, and a session's
cached prompt survives the other sessions' turns."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from voice_agent.backends.llm.http_client import sse_events
from voice_agent.backends.llm.llama_server import MODEL_ALIAS
from voice_agent.engine import Engine

SYSTEM = (
    "You are a friendly assistant on a phone line. Keep every answer short, warm and "
    "plain, with no lists and no markdown, because it is read aloud to the caller. "
)


def llama_url(engine: Engine) -> str:
    assert engine.llama is not None
    return engine.llama.base_url


async def complete(
    http: aiohttp.ClientSession, url: str, messages: list[dict[str, str]], tokens: int
) -> dict[str, Any]:
    """A streamed completion, as the sessions ask for them; returns the text
    and the server's own timings (its last chunk carries them)."""
    body = {
        "model": MODEL_ALIAS,
        "messages": messages,
        "max_tokens": tokens,
        "temperature": 0.0,
        "stream": True,
    }
    text: list[str] = []
    timings: dict[str, Any] = {}
    finish: str | None = None
    async with http.post(url + "/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()
        async for chunk in sse_events(response):
            for choice in chunk.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "")
                finish = choice.get("finish_reason") or finish
            timings = chunk.get("timings") or timings
    return {"text": "".join(text), "timings": timings, "finish": finish}


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    # llama-server closes the connection after each streamed reply.
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        yield session


async def decode_calls(http: aiohttp.ClientSession, url: str) -> float:
    """llama-server's count of its decode steps (its /metrics): a step
    decodes one token for every slot busy in it."""
    async with http.get(url.removesuffix("/v1") + "/metrics") as response:
        assert response.status == 200, await response.text()
        for line in (await response.text()).splitlines():
            name, _, value = line.partition(" ")
            if name == "llamacpp:n_decode_total":
                return float(value)
    raise AssertionError("llama-server's /metrics has no llamacpp:n_decode_total")


async def test_concurrent_requests_all_finish_and_none_is_cut_short(
    engine: Engine, http: aiohttp.ClientSession
) -> None:
    url = llama_url(engine)
    questions = [f"Tell me a story about a {animal}." for animal in ("cat", "dog", "owl", "fox")]
    steps_before = await decode_calls(http, url)
    together = await asyncio.gather(
        *(complete(http, url, [{"role": "user", "content": q}], 24) for q in questions)
    )
    steps = await decode_calls(http, url) - steps_before
    for reply in together:
        # Not interrupted: every reply runs to its token limit. (Batched
        # decoding is not bit-identical to decoding alone: the words may differ.)
        assert reply["finish"] == "length" and reply["timings"]["predicted_n"] == 24
        assert reply["text"].strip()
    # Decoded together, not one by one: one after another, the 4 x 24 tokens
    # would take at least 4 x 24 steps (prompts included, more).
    assert steps < 4 * 24, steps


@pytest.mark.slow
async def test_a_sessions_cached_prompt_survives_other_sessions_turns(
    engine: Engine, http: aiohttp.ClientSession
) -> None:
    url = llama_url(engine)
    history = [
        {"role": "system", "content": SYSTEM * 6},
        {"role": "user", "content": "My name is Zoe and I live in Lyon."},
    ]
    first = await complete(http, url, history, 8)
    prompt_tokens = first["timings"]["prompt_n"] + first["timings"].get("cache_n", 0)
    # Other callers take their turns, more of them than there are idle slots' worth.
    others = [
        [
            {"role": "system", "content": f"You are assistant number {i}. " * 30},
            {"role": "user", "content": f"Count to {i}."},
        ]
        for i in range(12)
    ]
    await asyncio.gather(*(complete(http, url, o, 8) for o in others))
    history += [
        {"role": "assistant", "content": first["text"]},
        {"role": "user", "content": "Where do I live?"},
    ]
    second = await complete(http, url, history, 8)
    # Zoe's earlier prompt came back from the cache: only the new tail was processed.
    assert second["timings"]["cache_n"] >= prompt_tokens - 8, (first, second)
    assert second["timings"]["prompt_n"] < 60, second
