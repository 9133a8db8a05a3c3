"""Whisper on ONNX Runtime against CTranslate2: what each hears and how long
each takes, on recorded human speech the STT was never tuned on.

Both arms are the service's own faster-whisper backend (FasterWhisperStt,
its batching worker, the default trimmed window), loaded side by side in
this process: ``onnx`` is the default (encoder and decoder on ONNX Runtime,
no CTranslate2 model loaded), ``ctranslate2`` runs both halves on
CTranslate2. Each utterance of bench/speech_sets.py's measurement set
(telephone prompts at 8 kHz, spontaneous speech, voice qualities, read
books) is transcribed by each arm in turn, the order alternating, so the
two arms' times are paired. It prints each arm's pooled WER by kind of
speech, the time to a transcript (p50 / p95, and the median of the paired
ratios), and every utterance the arms heard differently.

    .venv/bin/python bench/stt_runtimes.py
    .venv/bin/python bench/stt_runtimes.py --limit 60 --threads 2
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.packet_loss import errors, print_heard_differently
from bench.speech_sets import normalised, source, split_sets
from voice_agent.backends.stt.whisper import FasterWhisperStt
from voice_agent.testing.audio_data import words
from voice_agent.testing.figures import percentile, table

Runtime = Literal["onnx", "ctranslate2"]
ARMS: dict[str, Runtime] = {"onnx": "onnx", "ctranslate2": "ctranslate2"}  # both halves' runtime


async def main(args: argparse.Namespace) -> None:
    utterances = split_sets()["measurement"][: args.limit or None]
    models = {
        arm: FasterWhisperStt("base", "en", args.threads, decoder=runtime, encoder=runtime)
        for arm, runtime in ARMS.items()
    }
    for model in models.values():
        await model.warm_up()
    heard: dict[str, list[str]] = defaultdict(list)
    seconds: dict[str, list[float]] = defaultdict(list)
    for n, utterance in enumerate(utterances):
        order = list(models) if n % 2 == 0 else list(reversed(models))
        for arm in order:
            started = time.perf_counter()
            heard[arm].append(await models[arm].transcribe(utterance.audio))
            seconds[arm].append(time.perf_counter() - started)
    for model in models.values():
        model.close()

    kinds = sorted({source(u.name) for u in utterances})
    rows = []
    for arm in models:
        cells: list[object] = [arm]
        for kind in [*kinds, None]:
            chosen = [i for i, u in enumerate(utterances) if kind is None or source(u.name) == kind]
            total = sum(len(words(normalised(utterances[i].text))) for i in chosen)
            wrong = sum(errors(utterances[i].text, heard[arm][i]) for i in chosen)
            cells.append(f"{wrong / max(1, total):.3f} ({len(chosen)})")
        ms = [s * 1000 for s in seconds[arm]]
        cells += [f"{percentile(ms, 50):.0f}", f"{percentile(ms, 95):.0f}"]
        rows.append(cells)
    print(table(rows, ["arm", *kinds, "all", "p50 ms", "p95 ms"]))
    ratios = [a / b for a, b in zip(seconds["onnx"], seconds["ctranslate2"], strict=True)]
    print(
        f"\nonnx / ctranslate2 time, paired median ratio {statistics.median(ratios):.3f} "
        f"over {len(ratios)} utterances; onnx faster on "
        f"{sum(r < 1 for r in ratios)} of {len(ratios)}"
    )
    references = [(u.name, u.text) for u in utterances]
    print_heard_differently(references, heard, ("onnx", "ctranslate2"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=0, help="the first N utterances (0: all)")
    parser.add_argument("--threads", type=int, default=2, help="--stt-threads of both arms")
    asyncio.run(main(parser.parse_args()))
