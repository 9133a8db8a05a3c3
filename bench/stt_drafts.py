"""Whisper with and without a draft: what a turn's transcript at an earlier
pause saves its transcript at the end, and whether it changes what is heard.

A caller's turn is transcribed at a pause (the speculation) and again,
longer, at the next pause or its end; the earlier tokens are the decoder's
draft (backends/stt/whisper_drafts.py). For each utterance of
bench/speech_sets.py's measurement set with a pause inside it (the quietest
150 ms between 30 % and 85 % of it, at least 30 dB under its loudest
100 ms), this transcribes the audio up to 50 ms into that pause, as the
service would at the pause, then the whole utterance with that draft, and
the whole utterance without one; the order of the two alternates, so their
times are paired. Both are the service's own backend (FasterWhisperStt,
its batching worker and ONNX Runtime's encoder and decoder), one process.
Utterances without such a pause get no draft in service either and are
left out.

It prints the pooled WER of each arm, the time to the whole utterance's
transcript (p50 / p95 and the median of the paired ratios), how many
utterances were given a draft, and every utterance heard differently.

    .venv/bin/python bench/stt_drafts.py
    .venv/bin/python bench/stt_drafts.py --limit 60
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.packet_loss import errors, print_heard_differently
from bench.speech_sets import Utterance, normalised, split_sets
from voice_agent.backends.stt.whisper import FasterWhisperStt
from voice_agent.testing.audio_data import words
from voice_agent.testing.figures import percentile, table

HOP = 160  # 10 ms at 16 kHz
PAUSE_FRAMES = 15  # 150 ms
PAUSE_BELOW_DB = 30.0


def pause_inside(audio: np.ndarray) -> int | None:
    """The sample 50 ms into the quietest 150 ms between 30 % and 85 % of
    ``audio``, when it is a pause (PAUSE_BELOW_DB under the loudest 100 ms);
    else None."""
    frames = audio[: len(audio) // HOP * HOP].astype(np.float64).reshape(-1, HOP)
    energy = (frames * frames).mean(axis=1) + 1e-3
    lo, hi = int(len(energy) * 0.3), int(len(energy) * 0.85) - PAUSE_FRAMES
    if hi <= lo:
        return None
    windows = np.convolve(energy, np.ones(PAUSE_FRAMES) / PAUSE_FRAMES, mode="valid")
    quietest = lo + int(np.argmin(windows[lo:hi]))
    loudest = float(np.convolve(energy, np.ones(10) / 10, mode="valid").max())
    if 10 * np.log10(loudest / windows[quietest]) < PAUSE_BELOW_DB:
        return None
    return (quietest + 5) * HOP


async def main(args: argparse.Namespace) -> None:
    utterances: list[tuple[Utterance, int]] = []
    for utterance in split_sets()["measurement"][: args.limit or None]:
        cut = pause_inside(utterance.audio)
        if cut is not None:
            utterances.append((utterance, cut))
    stt = FasterWhisperStt("base", "en", args.threads)
    await stt.warm_up()
    recent = stt._batches.recent  # the drafts under test
    heard: dict[str, list[str]] = defaultdict(list)
    seconds: dict[str, list[float]] = defaultdict(list)
    kept: list[int] = []
    for n, (utterance, cut) in enumerate(utterances):
        for arm in ("draft", "none") if n % 2 == 0 else ("none", "draft"):
            recent.clear()
            if arm == "draft":
                await stt.transcribe(utterance.audio[:cut])
            drafted = recent.drafted
            started = time.perf_counter()
            heard[arm].append(await stt.transcribe(utterance.audio))
            seconds[arm].append(time.perf_counter() - started)
            if arm == "draft":
                kept.append(recent.drafted - drafted)
    stt.close()
    total = sum(len(words(normalised(u.text))) for u, _ in utterances)
    rows = []
    for arm in ("draft", "none"):
        wrong = sum(errors(u.text, heard[arm][i]) for i, (u, _) in enumerate(utterances))
        ms = [s * 1000 for s in seconds[arm]]
        rows.append(
            [
                arm,
                f"{wrong / max(1, total):.3f}",
                f"{percentile(ms, 50):.0f}",
                f"{percentile(ms, 95):.0f}",
            ]
        )
    print(f"{len(utterances)} utterances with a pause inside them\n")
    print(table(rows, ["arm", "pooled WER", "p50 ms", "p95 ms"]))
    ratios = [a / b for a, b in zip(seconds["draft"], seconds["none"], strict=True)]
    print(
        f"\ndraft / none time, paired median ratio {statistics.median(ratios):.3f}; "
        f"sooner with the draft on {sum(r < 1 for r in ratios)} of {len(ratios)}; "
        f"a draft given to {sum(kept)} of {len(kept)}"
    )
    references = [(u.name, u.text) for u, _ in utterances]
    print_heard_differently(references, heard, ("draft", "none"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=0, help="the first N utterances (0: all)")
    parser.add_argument("--threads", type=int, default=2, help="--stt-threads")
    asyncio.run(main(parser.parse_args()))
