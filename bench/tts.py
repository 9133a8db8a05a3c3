"""TTS: time to first audio and real-time factor, per backend and voice.

Each backend is made through the registry, as ``voice-agent serve`` makes
it, and driven through its ``stream()``: time to first audio is the call to
the first chunk; the real-time factor is the time to the last chunk over the
seconds of audio made (under 1: faster than it plays). One warm-up piece per
backend first; then ``--runs`` of each text, one at a time.

- ``piper``: each voice of ``--tts-voice`` (default: the packaged joe).
- ``openai``: the remote backend against voice_agent/testing/speech_server.py (OpenAI's
  ``/v1/audio/speech``, streamed PCM, the packaged Piper voice) in a separate
  process, over loopback HTTP; or against ``--tts-base-url`` when given.
- ``coqui``: when its backend is registered and installed and
  ``--tts-model PATH`` is given (``--tts-device`` too, if the backend has it).

    .venv/bin/python bench/tts.py
    .venv/bin/python bench/tts.py --tts-voice joe,/voices --runs 10
    .venv/bin/python bench/tts.py --tts-model /models/xtts --tts-device cpu
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from voice_agent.backends import registry
from voice_agent.backends.base import TtsBackend
from voice_agent.backends.capabilities import ClosesAsync
from voice_agent.config import Settings
from voice_agent.testing.figures import percentile, table
from voice_agent.testing.ports import free_port

TEXTS = {
    "short": "Hello there.",
    "clause": "Paris is the capital of France,",
    "sentence": "The museum opens at nine in the morning and closes at six, "
    "except on Mondays, when it stays closed all day.",
}


def settings(**values: Any) -> Settings:
    known = {k: v for k, v in values.items() if k in Settings.model_fields and v is not None}
    return Settings(**known)


async def measure(tts: TtsBackend, voice: str | None, text: str) -> tuple[float, float, int]:
    """Seconds to the first chunk, real-time factor, chunk count."""
    started = time.perf_counter()
    first: float | None = None
    samples = chunks = 0
    async for chunk in tts.stream(text, voice):
        if first is None:
            first = time.perf_counter() - started
        samples += chunk.size
        chunks += 1
    total = time.perf_counter() - started
    audio_s = samples / tts.sample_rate
    return first or total, total / audio_s if audio_s else float("inf"), chunks


async def bench_backend(
    label: str, tts: TtsBackend, voices: Sequence[str], runs: int
) -> list[list[object]]:
    rows: list[list[object]] = []
    await measure(tts, voices[0], "Warming up.")
    for voice in voices:
        for kind, text in TEXTS.items():
            firsts, factors, chunk_counts = [], [], []
            for _ in range(runs):
                first, factor, chunks = await measure(tts, voice, text)
                firsts.append(first)
                factors.append(factor)
                chunk_counts.append(chunks)
            rows.append(
                [
                    label,
                    voice,
                    kind,
                    f"{1000 * percentile(firsts, 50):.0f}",
                    f"{1000 * percentile(firsts, 95):.0f}",
                    f"{percentile(factors, 50):.3f}",
                    f"{percentile(chunk_counts, 50):.0f}",
                ]
            )
    return rows


async def close(tts: TtsBackend) -> None:
    if isinstance(tts, ClosesAsync):
        await tts.aclose()
    else:
        tts.close()


@asynccontextmanager
async def speech_server_process(threads: int) -> AsyncIterator[str]:
    """voice_agent/testing/speech_server.py in its own process; its base URL."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "voice_agent.testing.speech_server", "--port", str(port)),
        *("--threads", str(threads)),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert process.stdout is not None
        async with asyncio.timeout(120):
            line = await process.stdout.readline()
        if line.strip() != b"listening":
            raise RuntimeError(f"the speech server did not start: {line!r}")
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.terminate()
        await process.wait()


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=5, help="runs of each text")
    parser.add_argument("--tts-voice", default=None, help="Piper voices (as serve takes them)")
    parser.add_argument("--tts-threads", type=int, default=None, help="threads per synthesis")
    parser.add_argument("--tts-base-url", default=None, help="a remote server instead")
    parser.add_argument("--tts-remote-voice", default="joe", help="its voice")
    parser.add_argument("--tts-model", default=None, help="Coqui model (folder or .pth)")
    parser.add_argument("--tts-device", default=None, help="Coqui device")
    parser.add_argument("--skip", action="append", default=[], help="backends to leave out")
    args = parser.parse_args()
    base = {"tts_voice": args.tts_voice, "tts_threads": args.tts_threads}
    threads = settings(**base).tts_threads
    load_before = os.getloadavg()
    rows: list[list[object]] = []

    if "piper" not in args.skip:
        piper: TtsBackend = registry.create("tts", "piper", settings(**base))
        try:
            rows += await bench_backend("piper", piper, piper.voices(), args.runs)
        finally:
            await close(piper)

    if "openai" not in args.skip:
        async with remote_url(args.tts_base_url, threads) as url:
            remote: TtsBackend = registry.create(
                "tts",
                "openai",
                settings(
                    tts="openai",
                    tts_base_url=url,
                    tts_remote_voice=args.tts_remote_voice,
                    tts_model="piper",
                ),
            )
            try:
                label = "openai (Piper server)" if args.tts_base_url is None else "openai"
                rows += await bench_backend(label, remote, remote.voices(), args.runs)
            finally:
                await close(remote)

    coqui_note = coqui_unavailable(args.tts_model)
    if coqui_note is None and "coqui" not in args.skip:
        coqui: TtsBackend = registry.create(
            "tts",
            "coqui",
            settings(**base, tts="coqui", tts_model=args.tts_model, tts_device=args.tts_device),
        )
        try:
            rows += await bench_backend("coqui", coqui, coqui.voices(), args.runs)
        finally:
            await close(coqui)

    header = [
        "backend",
        "voice",
        "text",
        "first audio p50 ms",
        "p95 ms",
        "RTF p50",
        "chunks",
    ]
    print(table(rows, header))
    load_after = os.getloadavg()
    print(
        f"\n{args.runs} runs of each text, {threads} threads a synthesis; load average "
        f"{load_before[0]:.2f} before, {load_after[0]:.2f} after ({os.cpu_count()} CPUs)."
    )
    if coqui_note is not None:
        print(f"coqui: not measured ({coqui_note})")


def coqui_unavailable(model: str | None) -> str | None:
    """Why the Coqui backend cannot be measured here; None when it can."""
    if "coqui" not in registry.names("tts"):
        return "no coqui backend is registered in this checkout"
    missing = registry.spec("tts", "coqui").missing_modules()
    if missing:
        return f"needs {', '.join(missing)}: {registry.spec('tts', 'coqui').install_hint}"
    if model is None:
        return "give --tts-model PATH"
    return None


@asynccontextmanager
async def remote_url(url: str | None, threads: int) -> AsyncIterator[str]:
    """``url`` when given, else the Piper speech server started for the run."""
    if url is not None:
        yield url
        return
    async with speech_server_process(threads) as started:
        yield started


if __name__ == "__main__":
    asyncio.run(main())
