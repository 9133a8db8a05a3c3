"""STT throughput and per-utterance latency against concurrent sessions,
batched against unbatched.

Every session sends its utterances one after another (the next as soon as
the previous is transcribed), all sessions at once, through the backend's
own entry point (``transcribe``: the process-wide batching worker for
parakeet). Reports seconds of audio transcribed per wall-clock second and
per-utterance latency (submit to text) p50/p95, with the worker's batch
sizes. Unbatched is the same worker with ``--stt-max-batch 1``.

    .venv/bin/python bench/stt_throughput.py                    # tiny test model
    .venv/bin/python bench/stt_throughput.py --medium           # + untrained 256x16
    .venv/bin/python bench/stt_throughput.py --model x.nemo     # any NeMo model
    .venv/bin/python bench/stt_throughput.py --whisper          # + faster-whisper base
    .venv/bin/python bench/stt_throughput.py --device cuda      # on a GPU
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from voice_agent.backends import registry
from voice_agent.backends.base import SttBackend
from voice_agent.backends.capabilities import ReportsStats
from voice_agent.config import Settings
from voice_agent.testing.audio_data import librivox
from voice_agent.testing.figures import percentile, table
from voice_agent.testing.tiny_nemo import build_tiny_ctc, build_untrained_ctc, phrase_audio

CLIPS = [phrase_audio("goforward"), *(librivox(c) for c in ("0880", "0930", "0890", "0920"))]
RATE = 16_000


async def run(stt: SttBackend, sessions: int, utterances: int) -> dict[str, Any]:
    latencies: list[float] = []
    audio_s = 0.0

    async def session(index: int) -> None:
        nonlocal audio_s
        for turn in range(utterances):
            clip = CLIPS[(index + turn) % len(CLIPS)]
            started = time.perf_counter()
            await stt.transcribe(clip)
            latencies.append(time.perf_counter() - started)
            audio_s += len(clip) / RATE

    started = time.perf_counter()
    await asyncio.gather(*(session(i) for i in range(sessions)))
    wall = time.perf_counter() - started
    sizes: dict[str, int] = {}
    if isinstance(stt, ReportsStats):
        found = stt.stats().get("batch_sizes")
        sizes = found if isinstance(found, dict) else {}
    return {
        "throughput": audio_s / wall,
        "p50": percentile(latencies, 50) * 1000,
        "p95": percentile(latencies, 95) * 1000,
        "sizes": sizes,
    }


def mean_batch(sizes: dict[str, int]) -> str:
    batches = sum(sizes.values())
    if not batches:
        return "-"
    return f"{sum(int(k) * n for k, n in sizes.items()) / batches:.1f}"


async def measure(
    label: str, settings: dict[str, Any], levels: Sequence[int], utterances: int, batched: bool
) -> list[list[object]]:
    rows: list[list[object]] = []
    modes = [("batched", None), ("unbatched", 1)] if batched else [("one at a time", None)]
    for mode, max_batch in modes:
        for sessions in levels:
            values = dict(settings)
            if max_batch is not None:
                values["stt_max_batch"] = max_batch
            config = Settings(**values)
            stt: SttBackend = await asyncio.to_thread(registry.create, "stt", config.stt, config)
            try:
                await stt.transcribe(CLIPS[0])  # warm-up (one batch of 1 in the counts)
                result = await run(stt, sessions, utterances)
            finally:
                stt.close()
            rows.append(
                [
                    label,
                    mode,
                    sessions,
                    f"{result['throughput']:.1f}",
                    f"{result['p50']:.0f}",
                    f"{result['p95']:.0f}",
                    mean_batch(result["sizes"]),
                ]
            )
            print(table(rows[-1:], HEADER).splitlines()[-1], flush=True)
    return rows


HEADER = ["model", "mode", "sessions", "audio s / s", "p50 ms", "p95 ms", "mean batch"]


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--model", help="a .nemo file (default: build the tiny test model)")
    parser.add_argument("--medium", action="store_true", help="add an untrained 256x16 model")
    parser.add_argument("--whisper", action="store_true", help="add faster-whisper base")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--sessions", default="1,2,4,8", help="concurrency levels")
    parser.add_argument("--utterances", type=int, default=6, help="per session")
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads for inference")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    levels = [int(x) for x in args.sessions.split(",")]
    common = {
        "stt_device": args.device,
        "stt_threads": args.threads,
        "stt_max_batch": args.max_batch,
        "stt_batch_wait_ms": 10,
    }
    rows: list[list[object]] = []
    print(table([], HEADER))
    with tempfile.TemporaryDirectory() as folder:
        models: list[tuple[str, Path]] = []
        if args.model:
            models.append((Path(args.model).stem, Path(args.model)))
        else:
            models.append(("tiny 64x2", build_tiny_ctc(Path(folder) / "tiny")))
        if args.medium:
            models.append(("untrained 256x16", build_untrained_ctc(Path(folder) / "m", 256, 16)))
        for label, path in models:
            settings = {**common, "stt": "parakeet", "stt_model": str(path)}
            rows += await measure(label, settings, levels, args.utterances, batched=True)
    if args.whisper:
        settings = {"stt": "faster-whisper", "stt_threads": args.threads}
        rows += await measure("whisper base", settings, levels, args.utterances, batched=False)
    total = sum(len(c) for c in CLIPS) / RATE
    print(f"\n{len(CLIPS)} clips, {total:.1f} s of audio, {args.utterances} per session\n")
    print(table(rows, HEADER))


if __name__ == "__main__":
    asyncio.run(main())
