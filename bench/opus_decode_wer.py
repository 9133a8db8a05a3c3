"""Word error rate of the two ways the caller's Opus reaches the STT.

- ``48k``: aiortc's decoder (FFmpeg's libopus, 48 kHz stereo), the down-mix
  and the 3x FIR decimation of ``rtc/inbound.py``: the default path.
- ``16k``: libopus decoding straight to 16 kHz mono
  (``rtc/opus_wideband.py``, ``--input-opus-16k``).

Each utterance is encoded once per sender and the same packets go through
both decoders, so the paths differ in the decoding alone. The transcripts
come from the default STT backend, made through the registry as
``voice-agent serve`` makes it, one utterance at a time.

Senders: aiortc's encoder (96 kb/s stereo, what this project's clients and
tests send) and a browser-like one (libopus ``voip``, 32 kb/s mono, what
Chrome sends by default).

Speech: the five LibriVox recordings and "go forward ten meters" (human
speech), each also at -20 dB, at 0.9x and 1.1x speed and with white noise
at 15 dB SNR (seeded), plus sentences the packaged Piper voice reads.

    .venv/bin/python bench/opus_decode_wer.py
    .venv/bin/python bench/opus_decode_wer.py --stt-model tiny.en
"""

from __future__ import annotations

import argparse
import asyncio
import fractions
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
import soxr
from aiortc.codecs.opus import OpusDecoder, OpusEncoder
from aiortc.jitterbuffer import JitterFrame

from voice_agent.audio.resample import StreamResampler
from voice_agent.backends import registry
from voice_agent.config import Settings
from voice_agent.rtc.inbound import frame_to_mono_int16
from voice_agent.rtc.opus_wideband import WidebandOpusDecoder
from voice_agent.testing.audio_data import goforward, librivox, reference, word_error_rate, words

RATE = 16_000
OPUS_RATE = 48_000
FRAME = 960  # 20 ms at 48 kHz
CLIPS = ["0870", "0880", "0890", "0920", "0930"]
SENTENCES = [
    "What time does the pharmacy on Elm Street close tonight?",
    "Please book a table for four at seven thirty on Friday.",
    "My flight number is BA two eight six and it lands at noon.",
    "Can you remind me to call my sister tomorrow morning?",
    "The quick brown fox jumps over the lazy dog.",
    "How far is it from Boston to New York by train?",
    "Turn off the lights in the kitchen and the living room.",
    "I would like to change my delivery address, please.",
    "What is the weather going to be like this weekend?",
    "Send a message to Anna saying I will be ten minutes late.",
    "Is there a vegetarian option on the lunch menu?",
    "Add milk, eggs, bread and two apples to my shopping list.",
    "Which museum has the largest collection of modern art?",
    "Cancel my appointment with the dentist next Tuesday.",
    "How many tablespoons are there in a cup?",
    "Play some quiet piano music while I read.",
    "Could you explain how a heat pump works in simple words?",
    "My account number ends in four five nine one.",
    "Find me a hotel near the station with free parking.",
    "Why is the sky blue during the day and red at sunset?",
]


@dataclass(frozen=True)
class Utterance:
    name: str
    samples: np.ndarray  # 16 kHz mono int16
    text: str


def _gain(samples: np.ndarray, db: float) -> np.ndarray:
    scaled = samples.astype(np.float32) * 10 ** (db / 20)
    clipped: np.ndarray = np.clip(scaled, -32768, 32767)
    return clipped.astype(np.int16)


def _speed(samples: np.ndarray, factor: float) -> np.ndarray:
    # Resampling and playing at the old rate: faster and higher, like a
    # quicker talker, which is what speed perturbation in ASR training does.
    faster: np.ndarray = soxr.resample(samples, RATE * factor, RATE)
    return faster.astype(np.int16)


def _noisy(samples: np.ndarray, snr_db: float, seed: int) -> np.ndarray:
    speech = samples.astype(np.float32)
    power = float(np.mean(speech**2))
    noise = np.random.default_rng(seed).normal(0, np.sqrt(power / 10 ** (snr_db / 10)), len(speech))
    return np.clip(speech + noise, -32768, 32767).astype(np.int16)


def human_speech() -> list[Utterance]:
    bases = [(c, librivox(c), reference(c)) for c in CLIPS]
    bases.append(("goforward", goforward(), "go forward ten meters"))
    found: list[Utterance] = []
    for seed, (name, samples, text) in enumerate(bases):
        found += [
            Utterance(name, samples, text),
            Utterance(f"{name} -20dB", _gain(samples, -20), text),
            Utterance(f"{name} 0.9x", _speed(samples, 0.9), text),
            Utterance(f"{name} 1.1x", _speed(samples, 1.1), text),
            Utterance(f"{name} noise", _noisy(samples, 15, seed), text),
        ]
    return found


async def synthetic_speech(settings: Settings) -> list[Utterance]:
    tts = registry.create("tts", settings.tts, settings)
    try:
        found = []
        for i, text in enumerate(SENTENCES):
            chunks = [chunk async for chunk in tts.stream(text)]
            audio = soxr.resample(np.concatenate(chunks), tts.sample_rate, RATE)
            found.append(Utterance(f"piper {i}", audio.astype(np.int16), text))
        return found
    finally:
        tts.close()


def _to_48k_frames(samples: np.ndarray) -> list[np.ndarray]:
    padded = np.concatenate((np.zeros(RATE // 2, np.int16), samples, np.zeros(RATE // 2, np.int16)))
    wide = np.clip(soxr.resample(padded, RATE, OPUS_RATE), -32768, 32767).astype(np.int16)
    wide = np.concatenate((wide, np.zeros(-len(wide) % FRAME, np.int16)))
    return [wide[i : i + FRAME] for i in range(0, len(wide), FRAME)]


def _audio_frames(samples: np.ndarray) -> list[av.AudioFrame]:
    frames = []
    for pts, chunk in enumerate(_to_48k_frames(samples)):
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts = OPUS_RATE, pts * FRAME
        frame.time_base = fractions.Fraction(1, OPUS_RATE)
        frames.append(frame)
    return frames


def encode_aiortc(samples: np.ndarray) -> list[bytes]:
    encoder = OpusEncoder()
    packets: list[bytes] = []
    for frame in _audio_frames(samples):
        packets += encoder.encode(frame)[0]
    return packets


def encode_browser_like(samples: np.ndarray) -> list[bytes]:
    codec = av.CodecContext.create("libopus", "w")
    codec.bit_rate = 32_000
    codec.format = "s16"
    codec.layout = "mono"
    codec.sample_rate = OPUS_RATE
    codec.time_base = fractions.Fraction(1, OPUS_RATE)
    codec.options = {"application": "voip", "frame_duration": "20"}
    packets: list[bytes] = []
    for frame in _audio_frames(samples):
        packets += [bytes(p) for p in codec.encode(frame)]
    packets += [bytes(p) for p in codec.encode(None)]
    return packets


def decode_48k(packets: list[bytes]) -> np.ndarray:
    decoder = OpusDecoder()
    resampler = StreamResampler(OPUS_RATE, RATE, low_latency=True)
    out = []
    for i, payload in enumerate(packets):
        for frame in decoder.decode(JitterFrame(data=payload, timestamp=i * FRAME)):
            assert isinstance(frame, av.AudioFrame)
            out.append(resampler.process(frame_to_mono_int16(frame)))
    return np.concatenate(out)


def decode_16k(packets: list[bytes]) -> np.ndarray:
    decoder = WidebandOpusDecoder()
    try:
        return np.concatenate([decoder.decode(p, i * FRAME).samples for i, p in enumerate(packets)])
    finally:
        decoder.close()


SENDERS: dict[str, Callable[[np.ndarray], list[bytes]]] = {
    "aiortc 96k stereo": encode_aiortc,
    "browser-like 32k mono": encode_browser_like,
}
PATHS: dict[str, Callable[[list[bytes]], np.ndarray]] = {"48k": decode_48k, "16k": decode_16k}


async def heard_both(stt: Any, packets: list[bytes]) -> dict[str, str]:
    return {path: await stt.transcribe(decode(packets)) for path, decode in PATHS.items()}


def edits(utterance: Utterance, text: str) -> int:
    return round(word_error_rate(utterance.text, text) * len(words(utterance.text)))


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.WARNING)
    settings = Settings(stt_model=args.stt_model) if args.stt_model else Settings()
    speech = {"human": human_speech(), "piper": await synthetic_speech(settings)}
    stt = registry.create("stt", settings.stt, settings)
    wrong: dict[tuple[str, str, str], int] = {}
    differing: list[str] = []
    try:
        await stt.warm_up()
        for sender, encode in SENDERS.items():
            for kind, utterances in speech.items():
                for utterance in utterances:
                    heard = await heard_both(stt, encode(utterance.samples))
                    for path, text in heard.items():
                        key = (sender, kind, path)
                        wrong[key] = wrong.get(key, 0) + edits(utterance, text)
                    if words(heard["48k"]) != words(heard["16k"]):
                        differing.append(f"{sender}, {utterance.name}: {heard}")
    finally:
        stt.close()
    print("| sender | speech | utterances | words | WER 48k path | WER 16k path |")
    print("|---|---|---|---|---|---|")
    for sender in SENDERS:
        for kind, utterances in speech.items():
            n = sum(len(words(u.text)) for u in utterances)
            rates = [wrong[(sender, kind, path)] / n for path in PATHS]
            cells = " | ".join(f"{r:.3f}" for r in rates)
            print(f"| {sender} | {kind} | {len(utterances)} | {n} | {cells} |")
    print(f"\n{len(differing)} transcripts differ between the paths:")
    for line in differing:
        print(f"- {line}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stt-model", help="faster-whisper model (default: the service's)")
    asyncio.run(main(parser.parse_args()))
