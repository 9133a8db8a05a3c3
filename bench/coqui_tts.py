"""Coqui TTS: time to first audio and real-time factor, per model, on this
machine, through the backend's own entry point (``stream``, as a reply uses
it). Without ``--model`` it builds the tests' tiny untrained models (a
two-speaker VITS, an XTTS-v2-style model that streams); their figures say
what the backend's machinery costs, not what a trained XTTS-v2 costs (its
weights are ~1.8 GB: pass their folder with --model on a machine that has
them, with --device cuda on a GPU).

    .venv/bin/python bench/coqui_tts.py                         # tiny VITS + XTTS
    .venv/bin/python bench/coqui_tts.py --model ~/XTTS-v2 --voice speaker.wav

``coqui_rows`` is what a bench covering every backend can call.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from voice_agent.backends import registry
from voice_agent.backends.base import TtsBackend
from voice_agent.config import Settings
from voice_agent.testing.figures import table

SENTENCES = [
    "Hello, thanks for calling.",
    "The weather today is sunny with a light breeze from the west.",
    "Could you tell me the name on the reservation, please?",
]
HEADER = ["backend", "model", "streams", "first audio ms p50", "piece ms p50", "audio s", "RTF"]


async def measure(tts: TtsBackend, label: str, rounds: int) -> list[object]:
    """One piece at a time (a lone caller): first chunk, whole piece, audio."""
    firsts: list[float] = []
    wholes: list[float] = []
    audio_s = 0.0
    busy_s = 0.0
    await _speak(tts, "Warming up.")
    for _ in range(rounds):
        for text in SENTENCES:
            started = time.perf_counter()
            first: float | None = None
            samples = 0
            async for chunk in tts.stream(text, urgent=True):
                if first is None and chunk.size:
                    first = time.perf_counter() - started
                samples += chunk.size
            whole = time.perf_counter() - started
            firsts.append((first or whole) * 1000)
            wholes.append(whole * 1000)
            audio_s += samples / tts.sample_rate
            busy_s += whole
    streams = bool(getattr(tts, "streams", False))
    return [
        tts.name,
        label,
        "yes" if streams else "no",
        round(statistics.median(firsts)),
        round(statistics.median(wholes)),
        round(audio_s, 2),
        round(busy_s / audio_s, 2) if audio_s else "-",
    ]


async def _speak(tts: TtsBackend, text: str) -> None:
    async for _ in tts.stream(text):
        pass


async def coqui_rows(
    models: Sequence[tuple[str, Path, str | None]], device: str = "cpu", rounds: int = 2
) -> list[list[object]]:
    """A table row per (label, model folder, --tts-voice) through --tts coqui."""
    rows = []
    for label, model, voice in models:
        settings = Settings(tts="coqui", tts_model=str(model), tts_device=device, tts_voice=voice)
        tts: TtsBackend = await asyncio.to_thread(registry.create, "tts", "coqui", settings)
        try:
            rows.append(await measure(tts, label, rounds))
        finally:
            tts.close()
    return rows


def tiny_models(folder: Path) -> list[tuple[str, Path, str | None]]:
    from voice_agent.testing.tiny_coqui import build_tiny_vits, build_tiny_xtts

    return [
        ("tiny VITS (265 k params, untrained)", build_tiny_vits(folder / "vits"), None),
        ("tiny XTTS (22.5 M params, untrained)", build_tiny_xtts(folder / "xtts"), None),
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a Coqui model folder (default: tiny ones)")
    parser.add_argument("--voice", help="--tts-voice for it (XTTS: a speaker wav or folder)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda", "auto"])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as scratch:
        if args.model:
            models = [(args.model.name, args.model, args.voice)]
        else:
            models = tiny_models(Path(scratch))
        rows = asyncio.run(coqui_rows(models, args.device, args.rounds))
    print(table(rows, HEADER))
    print(
        "first audio: stream() called to its first chunk; piece: to its last; "
        "RTF: synthesis time / audio time (below 1 keeps up with playback)"
    )


if __name__ == "__main__":
    main()
