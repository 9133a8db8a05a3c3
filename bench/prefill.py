"""Does prefilling the user's words so far shorten the LLM's first token?

The embedded llama-server, started as the service starts it (the Engine's
own launcher, default settings), answers a typical 12-25-word user turn
after a short conversation, with its prompt cache in one of four states:

  (a) none:     nothing of this conversation cached (only the system prompt,
                as the service's warm-up leaves it)
  (b) history:  the conversation so far and an empty user message prefilled
                (``--llm-prefill``, what a session does today after each reply)
  (c) partial:  the history and all but the last N words of the user's turn
                prefilled (what a partial transcript a moment before the
                pause would give)
  (d) all:      the history and every word of the turn prefilled (the bound:
                a partial transcript that already holds the whole turn)

Each prefill is the request the session sends (``OpenAIChatLlm.prefill``:
Chat Completions, one token, so the prompt ends with the template's
end-of-message tokens); each reply is the request body the session sends,
streamed. Time to first token is measured at the client; the server's own
``prompt_n`` (tokens it had to process) shows what the cache held.
Conditions are interleaved round by round; every round is a conversation of
its own, so no condition inherits another's cache.

    nice -n 5 .venv/bin/python bench/prefill.py              # 12 rounds
    nice -n 5 .venv/bin/python bench/prefill.py --rounds 20 --cut 3
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from voice_agent.backends.base import ChatMessage
from voice_agent.backends.llm.chat_completions import OpenAIChatLlm
from voice_agent.backends.llm.http_client import sse_events
from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.session.conversation import Conversation
from voice_agent.testing.figures import percentile

# Typical spoken turns, 12-25 words each.
TURNS = [
    "I was wondering if you could tell me what the weather is going to be like tomorrow "
    "afternoon in Lisbon",
    "Can you remind me how long I should boil an egg if I want the yolk to stay a little soft",
    "My daughter asked me why the sky is blue and I honestly did not know what to tell her",
    "What would be a good name for a small grey kitten that likes to sleep on the piano all day",
    "I need to get to the train station by six so when should I leave the house if I walk",
    "Could you suggest something quick for dinner tonight using chicken rice and whatever "
    "vegetables I have left",
    "How many cups of coffee a day are still fine for an adult who sleeps badly at night",
    "Tell me one interesting fact about octopuses that I can share with my class tomorrow morning",
    "I keep forgetting the difference between affect and effect so can you explain it simply",
    "What is the best way to keep basil alive on a windowsill that gets sun only in the morning",
    "Is it a good idea to run every single day or should I take a rest day now and then",
    "Please give me a short motivating sentence because I have an exam on Monday and feel nervous",
]
HISTORY_TOPICS = [
    "bicycles",
    "the moon",
    "tea",
    "volcanoes",
    "jazz",
    "penguins",
    "gardening",
    "chess",
    "rain",
    "trains",
    "bread",
    "whales",
]
CONDITIONS = ("none", "history", "partial", "all")
LABELS = {
    "none": "(a) no prefill",
    "history": "(b) history prefilled (today)",
    "partial": "(c) history + all but the last {cut} words",
    "all": "(d) history + every word of the turn",
}


def history(round_no: int, condition: str) -> list[tuple[str, str]]:
    """Two past exchanges, different for every round and condition: no
    condition finds another's conversation in the cache."""
    topic = HISTORY_TOPICS[round_no % len(HISTORY_TOPICS)]
    tag = f"{condition} {round_no}"
    return [
        (
            f"Hello there, I have a question about {topic} ({tag}).",
            f"Sure, ask away about {topic}.",
        ),
        (
            f"What is the most surprising thing about {topic}?",
            f"Many people are surprised by how old the history of {topic} is.",
        ),
    ]


@dataclass
class Result:
    first_ms: list[float] = field(default_factory=list)
    prompt_n: list[int] = field(default_factory=list)


async def sse_chunks(
    http: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> AsyncIterator[dict[str, Any]]:
    """Each JSON chunk of a streamed Chat Completions request, read by the
    LLM client's own event-stream parser."""
    async with http.post(url, json=body) as response:
        response.raise_for_status()
        async for chunk in sse_events(response):
            yield chunk


async def reply(
    http: aiohttp.ClientSession, llm: OpenAIChatLlm, base_url: str, messages: list[ChatMessage]
) -> tuple[float, int]:
    """The session's reply request (its body, streamed): ms to the first
    token, and how many prompt tokens the server processed."""
    settings = Settings()
    body = llm.request_body(messages, settings.llm_max_tokens, settings.llm_temperature, (), "auto")
    body["max_tokens"] = 4  # only the first token is timed
    started = time.perf_counter()
    first = 0.0
    prompt_n = -1
    async for chunk in sse_chunks(http, base_url + "/chat/completions", body):
        for choice in chunk.get("choices") or []:
            if (choice.get("delta") or {}).get("content") and not first:
                first = time.perf_counter() - started
        timings = chunk.get("timings")
        if timings:
            prompt_n = int(timings.get("prompt_n", -1))
    return first * 1000, prompt_n


async def one_round(
    http: aiohttp.ClientSession,
    llm: OpenAIChatLlm,
    base_url: str,
    instructions: str,
    round_no: int,
    condition: str,
    cut: int,
) -> tuple[float, int]:
    conversation = Conversation(instructions, 4)
    for user, assistant in history(round_no, condition):
        conversation.add_user(user)
        conversation.add(ChatMessage("assistant", assistant))
    turn = TURNS[round_no % len(TURNS)]
    words = turn.split()
    if condition == "history":
        await llm.prefill(conversation.messages_for(""))
    elif condition == "partial":
        await llm.prefill(conversation.messages_for(" ".join(words[:-cut])))
    elif condition == "all":
        await llm.prefill(conversation.messages_for(turn))
    # The user speaks on a moment after the prefill: the server is idle again.
    await asyncio.sleep(0.05)
    return await reply(http, llm, base_url, conversation.messages_for(turn))


def table(results: dict[str, Result], cut: int) -> str:
    base = statistics.median(results["history"].first_ms)
    base95 = percentile(results["history"].first_ms, 95)
    lines = [
        f"| {'cache state before the reply':<46} | {'TTFT p50':>8} | {'p95':>7} "
        f"| {'p50/(b)':>7} | {'p95/(b)':>7} | {'prompt tok':>10} | {'n':>3} |",
        f"|{'-' * 48}|{'-' * 10}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 12}|{'-' * 5}|",
    ]
    for condition in CONDITIONS:
        r = results[condition]
        p50 = statistics.median(r.first_ms)
        p95 = percentile(r.first_ms, 95)
        lines.append(
            f"| {LABELS[condition].format(cut=cut):<46} | {p50:>6.1f}ms | {p95:>5.1f}ms "
            f"| {p50 / base:>7.2f} | {p95 / base95:>7.2f} "
            f"| {statistics.median(r.prompt_n):>10.0f} | {len(r.first_ms):>3} |"
        )
    return "\n".join(lines)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--cut", type=int, default=3, help="words of the turn not prefilled (c)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    settings = Settings()
    engine = Engine(settings)
    llm = await engine.start_llm()
    assert isinstance(llm, OpenAIChatLlm) and engine.llama is not None
    base_url = engine.llama.base_url
    results = {condition: Result() for condition in CONDITIONS}
    try:
        # The service's warm-up: the system prompt is cached before any call.
        await llm.prefill(
            [ChatMessage("system", settings.llm_instructions), ChatMessage("user", "Hi")]
        )
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            for round_no in range(args.rounds):
                order = CONDITIONS[round_no % 4 :] + CONDITIONS[: round_no % 4]
                for condition in order:
                    first, prompt_n = await one_round(
                        http,
                        llm,
                        base_url,
                        settings.llm_instructions,
                        round_no,
                        condition,
                        args.cut,
                    )
                    results[condition].first_ms.append(first)
                    results[condition].prompt_n.append(prompt_n)
    finally:
        await llm.aclose()
        await engine.llama.stop()
    print(
        f"embedded llama-server ({Path(engine.llama.model_path).name}, "
        f"{settings.llama_threads} threads, {settings.llama_parallel} slots), "
        f"{args.rounds} rounds, turns of 12-25 words"
    )
    print(table(results, args.cut))


if __name__ == "__main__":
    asyncio.run(main())
