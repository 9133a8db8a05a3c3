"""The embedded LLM's speed and accuracy in each --llama-weights quantisation.

One embedded llama-server per quantisation (the Engine's own launcher,
default settings), all up at once and asked in turn, round by round, so
every quantisation sees the same machine state. Each round is the reply a
session sends after its history prefill (bench/prefill.py's conversations):
time to the first token and to the 8th (about a first piece of 5 words), at
the client, and the server's own per-token prompt and generation times.

With ``--perplexity`` (llama.cpp's llama-perplexity, built from the same
sources: docs/measurements.md says how) it also reports each quantisation's
perplexity on a text, and its KL divergence from the packaged Q4_1 weights
(how far the next-token distribution moves; 0 = identical).

    nice -n 5 .venv/bin/python bench/llm_weights.py --rounds 12
    .venv/bin/python bench/llm_weights.py --rounds 0 \\
        --perplexity /tmp/ppl/build/bin/llama-perplexity --text /usr/share/common-licenses/GPL-3
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import get_args

import aiohttp

from voice_agent.backends.base import ChatMessage
from voice_agent.backends.llm.chat_completions import OpenAIChatLlm
from voice_agent.backends.llm.http_client import HttpLlmConfig
from voice_agent.backends.llm.llama_server import EmbeddedLlamaServer, default_model_path
from voice_agent.backends.llm.weights import Quantisation, weights_for
from voice_agent.config import Settings
from voice_agent.session.conversation import Conversation

# ``python bench/<script>.py`` puts bench/ on the path, not the checkout's
# root, which the bench.* imports below are found from.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.prefill import TURNS, history, sse_chunks

PIECE_TOKENS = 8


@dataclass
class Result:
    first_ms: list[float] = field(default_factory=list)
    piece_ms: list[float] = field(default_factory=list)
    prompt_per_token: list[float] = field(default_factory=list)
    gen_per_token: list[float] = field(default_factory=list)


async def reply(
    http: aiohttp.ClientSession, llm: OpenAIChatLlm, base_url: str, messages: list[ChatMessage]
) -> tuple[float, float, dict[str, float]]:
    settings = Settings()
    body = llm.request_body(messages, settings.llm_max_tokens, settings.llm_temperature, (), "auto")
    body["max_tokens"] = PIECE_TOKENS + 8
    body["temperature"] = 0.0  # every quantisation says its most likely words
    started = time.perf_counter()
    first = piece = 0.0
    tokens = 0
    timings: dict[str, float] = {}
    async for chunk in sse_chunks(http, base_url + "/chat/completions", body):
        for choice in chunk.get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                tokens += 1
                elapsed = (time.perf_counter() - started) * 1000
                first = first or elapsed
                if tokens == PIECE_TOKENS:
                    piece = elapsed
        timings = chunk.get("timings") or timings
    return first, piece, timings


def perplexity(binary: Path, model: Path, text: Path, base_logits: Path, make_base: bool) -> str:
    """llama-perplexity's final estimate and, against the base logits, its KL
    divergence and how often the top token is the same."""
    args = [str(binary), "-m", str(model), "-t", "2", "-c", "256", "-b", "256"]
    if make_base:
        args += ["-f", str(text), "--kl-divergence-base", str(base_logits)]
    else:
        args += ["--kl-divergence-base", str(base_logits), "--kl-divergence"]
    done = subprocess.run(args, capture_output=True, text=True, check=True)
    out = done.stdout + done.stderr
    if make_base:
        found = re.search(r"Final estimate: PPL = ([\d.]+) \+/- ([\d.]+)", out)
        return f"PPL {found.group(1)} ± {found.group(2)}" if found else "?"
    ppl = re.search(r"Mean PPL\(Q\)\s*:\s*([\d.]+)\s*±\s*([\d.]+)", out)
    kld = re.search(r"Mean\s+KLD:\s*([\d.]+)\s*±\s*([\d.]+)", out)
    same = re.search(r"Same top p:\s*([\d.]+)\s*±\s*([\d.]+) %", out)
    parts = [
        f"PPL {ppl.group(1)} ± {ppl.group(2)}" if ppl else "PPL ?",
        f"KLD {kld.group(1)} ± {kld.group(2)}" if kld else "KLD ?",
        f"same top token {same.group(1)} %" if same else "",
    ]
    return ", ".join(p for p in parts if p)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--perplexity", type=Path, help="llama-perplexity binary")
    parser.add_argument("--text", type=Path, help="text for the perplexity")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    settings = Settings()
    kinds: tuple[Quantisation, ...] = get_args(Quantisation)
    paths = {kind: weights_for(default_model_path(), kind) for kind in kinds}

    if args.perplexity:
        if args.text is None:
            parser.error("--perplexity needs --text")
        with tempfile.TemporaryDirectory() as folder:
            base = Path(folder) / "base.kld"
            print(
                f"perplexity on {args.text.name} (256-token windows), KL divergence from packaged"
            )
            for kind in kinds:
                line = perplexity(args.perplexity, paths[kind], args.text, base, kind == "packaged")
                print(f"| {kind:<8} | {paths[kind].stat().st_size / 1e6:6.1f} MB | {line} |")
    if args.rounds <= 0:
        return

    servers = {
        kind: EmbeddedLlamaServer(
            paths[kind],
            settings.llama_threads,
            settings.llama_ctx,
            poll=settings.llama_poll,
            parallel=settings.llama_parallel,
            cache_ram_mb=settings.llama_cache_ram_mb,
        )
        for kind in kinds
    }
    results = {kind: Result() for kind in kinds}
    llms: dict[str, OpenAIChatLlm] = {}
    try:
        for kind, server in servers.items():
            await server.start(supervise=False)
            llms[kind] = OpenAIChatLlm(
                HttpLlmConfig(base_url=server.base_url, api_key=None, model="m")
            )
            await llms[kind].prefill(
                [ChatMessage("system", settings.llm_instructions), ChatMessage("user", "Hi")]
            )
        connector = aiohttp.TCPConnector(force_close=True)
        async with aiohttp.ClientSession(connector=connector) as http:
            for round_no in range(args.rounds):
                order = kinds[round_no % len(kinds) :] + kinds[: round_no % len(kinds)]
                for kind in order:
                    conversation = Conversation(settings.llm_instructions, 4)
                    for user, assistant in history(round_no, kind):
                        conversation.add_user(user)
                        conversation.add(ChatMessage("assistant", assistant))
                    await llms[kind].prefill(conversation.messages_for(""))
                    await asyncio.sleep(0.05)
                    turn = TURNS[round_no % len(TURNS)]
                    first, piece, timings = await reply(
                        http, llms[kind], servers[kind].base_url, conversation.messages_for(turn)
                    )
                    r = results[kind]
                    r.first_ms.append(first)
                    r.piece_ms.append(piece)
                    r.prompt_per_token.append(float(timings.get("prompt_per_token_ms", 0)))
                    r.gen_per_token.append(float(timings.get("predicted_per_token_ms", 0)))
    finally:
        for llm in llms.values():
            await llm.aclose()
        for server in servers.values():
            await server.stop()
    print(
        f"\nembedded llama-server, {settings.llama_threads} threads, {args.rounds} rounds "
        "(history prefilled, then a 12-25-word turn), medians:"
    )
    base_piece = statistics.median(results["packaged"].piece_ms)
    print("| weights | 1st token ms | 8th token ms | ratio | prompt ms/token | gen ms/token |")
    print("|---|---|---|---|---|---|")
    for kind in kinds:
        r = results[kind]
        piece = statistics.median(r.piece_ms)
        print(
            f"| {kind} | {statistics.median(r.first_ms):.0f} | {piece:.0f} "
            f"| {piece / base_piece:.2f} "
            f"| {statistics.median(r.prompt_per_token):.1f} "
            f"| {statistics.median(r.gen_per_token):.1f} |"
        )


if __name__ == "__main__":
    asyncio.run(main())
