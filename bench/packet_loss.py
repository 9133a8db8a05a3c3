"""Word error rate of a phone call (G.711) that loses packets, with the lost
20 ms spliced out, zero-filled, or concealed (rtc/inline_decoding.py with
audio/concealment.py: ITU-T G.711 Appendix I, from both sides of the gap).

Offline, no call: each utterance of the measurement set (bench/speech_sets.py:
telephone prompts, spontaneous speech, odd voices, read books; never the
tuning set) is taken to 8 kHz, encoded as PCMU in 20 ms packets, and a
random share of them dropped (each packet lost with the same probability,
seeded per utterance and run). What arrives goes through the real inline
decoder of a call's receiver, then the real inbound pump (to 16 kHz), then
what a session does with it: the VAD and the turn detector at their
defaults (silence ends a turn: ``--turn-detection silence``), each turn's
audio heard by the service's STT backend (made through the registry as
``voice-agent serve`` makes it) the way a session hears a turn's end
(``session/hearing.py``: the fast decode, again the safe way when it is not
to be trusted). An utterance the agent took as two turns is scored on their
transcripts joined; none scores as an empty transcript.

Arms, for the same packets:
- ``spliced``: the decoder without concealment (``conceal=False``): the session hears
  the packets that arrived end to end;
- ``zero-filled``: the same, each lost packet's 20 ms replaced by silence;
- ``before only``: the same, each gap concealed from the audio before it
  alone, as Appendix I does (``G711Concealer.lost`` without ``following``);
- ``concealed``: the decoder as it is.

At 0 % loss the arms hear the same audio (the concealed one 3.75 ms later),
so only ``spliced`` and ``concealed`` are run. Prints WER per arm and loss
rate (pooled over words, all seeds), the runs whose turn count differs
from the loss-free run's, the concealed arm against each other arm on the
same loss patterns (runs with fewer and more word errors, and a sign test),
and every utterance and seed that came out worse than the loss-free run, by
two words or more, or in another number of turns.

    .venv/bin/python bench/packet_loss.py
    .venv/bin/python bench/packet_loss.py --seeds 1 --limit 40
    .venv/bin/python bench/packet_loss.py --rates 0.05 0.1 0.2 --stt-model tiny.en
    .venv/bin/python bench/packet_loss.py --log /tmp/loss.jsonl   # every run, as it ends
    .venv/bin/python bench/packet_loss.py --rates 0.1 --arms "before only" concealed
"""

from __future__ import annotations

import argparse
import asyncio
import fractions
import json
import logging
import math
import re
import sys
import threading
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from aiortc import MediaStreamTrack, RTCRtpCodecParameters
from aiortc.jitterbuffer import JitterFrame
from aiortc.mediastreams import MediaStreamError

from voice_agent.audio.concealment import G711Concealer
from voice_agent.audio.resample import StreamResampler
from voice_agent.backends import registry
from voice_agent.config import Settings
from voice_agent.engine import turn_config
from voice_agent.rtc.g711 import _table
from voice_agent.rtc.inbound import pump_inbound_audio
from voice_agent.rtc.inline_decoding import InlineDecoder
from voice_agent.rtc.opus_wideband import DecodedAudio
from voice_agent.session.hearing import Hearing, HearingStats
from voice_agent.stages.turns import FRAME_SAMPLES, TurnDetector, TurnEnded
from voice_agent.stages.vad import SpeechDetector
from voice_agent.testing.audio_data import word_error_rate, words
from voice_agent.testing.figures import table

# ``python bench/<script>.py`` puts bench/ on the path, not the checkout's
# root, which the bench.* imports below are found from.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.speech_sets import Utterance, normalised, split_sets

RATE = 16_000
NARROW = 8_000
PACKET = NARROW // 50  # 20 ms
PCMU = RTCRtpCodecParameters(mimeType="audio/PCMU", clockRate=NARROW, channels=1, payloadType=0)
TRAILING_S = 0.8  # silence after the speech: longer than the turn's end (500 ms)
ARMS = ["spliced", "zero-filled", "before only", "concealed"]
WORSE_BY = 2  # word errors more than the loss-free run's: a failure


@dataclass
class Heard:
    arm: str
    rate: float
    seed: int
    name: str
    reference: str
    transcript: str
    turns: int


class _Receiver:
    """What an InlineDecoder uses of aiortc's receiver: its track's queue
    and its decoder-error flag."""

    def __init__(self) -> None:
        self._track = type("Track", (), {"_queue": asyncio.Queue()})()
        self._RTCRtpReceiver__decoder_error = threading.Event()


class _Track(MediaStreamTrack):
    kind = "audio"

    def __init__(self, items: list[Any]) -> None:
        super().__init__()
        self._items = list(items)

    async def recv(self) -> Any:
        if not self._items:
            raise MediaStreamError
        return self._items.pop(0)


def packets(utterance: Utterance) -> list[bytes]:
    """The utterance (and the silence after it) as a phone sends it."""
    audio = np.concatenate((utterance.audio, np.zeros(int(TRAILING_S * RATE), np.int16)))
    down = StreamResampler(RATE, NARROW)
    narrow = np.concatenate((down.process(audio), down.process(np.zeros(0, np.int16), True)))
    narrow = narrow[: len(narrow) // PACKET * PACKET]
    codes = _table("PCMU")[narrow.astype(np.int32) + 32768]
    return [bytes(codes[i : i + PACKET]) for i in range(0, len(codes), PACKET)]


def lost_packets(count: int, rate: float, seed: int, name: str) -> np.ndarray:
    """Independent losses, the same for every arm (seeded by utterance and
    seed); never the first three packets, which a call's greeting covers."""
    if rate == 0:
        return np.zeros(count, bool)
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    lost = rng.random(count) < rate
    lost[:3] = False
    return lost


def decoded(payloads: list[bytes], lost: np.ndarray, arm: str) -> list[Any]:
    """What the receiver's track yields for the packets that arrived."""
    receiver = _Receiver()
    inline = InlineDecoder(receiver, conceal=arm == "concealed")
    for index, payload in enumerate(payloads):
        if not lost[index]:
            inline.put((PCMU, JitterFrame(payload, index * PACKET)))
    inline.put(None)
    queue = receiver._track._queue
    items = [queue.get_nowait() for _ in range(queue.qsize())][:-1]  # the end: None
    if arm == "before only":
        return concealed_from_before(items)
    if arm != "zero-filled":
        return items
    filled: list[Any] = []
    expected = 0
    for item in items:
        if item.pts > expected:
            silence = np.zeros(item.pts - expected, np.int16)
            filled.append(DecodedAudio(silence, expected, NARROW, fractions.Fraction(1, NARROW)))
        filled.append(item)
        expected = item.pts + item.samples
    return filled


def concealed_from_before(items: list[Any]) -> list[Any]:
    """The packets that arrived (decoded, in order, stamped), each gap
    filled from the audio before it alone: Appendix I's extrapolation."""
    concealer = G711Concealer()
    out: list[Any] = []
    expected = 0
    for item in items:
        samples = item.to_ndarray().reshape(-1).astype(np.int16)
        pieces = [concealer.lost(item.pts - expected), concealer.good(samples)]
        audio = np.concatenate(pieces)
        start = item.pts + len(samples) - concealer.held - len(audio)
        out.append(DecodedAudio(audio, start, NARROW, fractions.Fraction(1, NARROW)))
        expected = item.pts + len(samples)
    return out


async def heard_at_16k(items: list[Any]) -> np.ndarray:
    chunks: list[np.ndarray] = []
    await pump_inbound_audio(_Track(items), lambda samples, _position: chunks.append(samples))
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)


async def listened(
    audio: np.ndarray, settings: Settings, vad: Any, hearing: Hearing
) -> tuple[str, int]:
    """The transcript of every turn a session would take in ``audio``."""
    speech = SpeechDetector(vad, settings.vad_floor_dbfs)
    detector = TurnDetector(turn_config(settings))
    turns: list[TurnEnded] = []
    for start in range(0, len(audio) - FRAME_SAMPLES + 1, FRAME_SAMPLES):
        frame = audio[start : start + FRAME_SAMPLES]
        turns += [
            e for e in detector.push(frame, speech.probability(frame)) if isinstance(e, TurnEnded)
        ]
    last = detector.end_turn()
    if last is not None:
        turns.append(last)
    texts = [(await hearing.final(t.audio, t.voiced_ms, None)).text for t in turns]
    return " ".join(t.strip() for t in texts if t.strip()), len(turns)


def print_heard_differently(
    references: list[tuple[str, str]], heard: dict[str, list[str]], arms: tuple[str, str]
) -> None:
    """Each utterance (name, reference text) the two ``arms`` heard
    differently, with each arm's word errors and transcript."""
    first, second = arms
    differ = [i for i in range(len(references)) if heard[first][i] != heard[second][i]]
    print(f"\nheard differently: {len(differ)} of {len(references)}")
    for i in differ:
        name, text = references[i]
        counts = ", ".join(f"{arm} {errors(text, heard[arm][i])}" for arm in arms)
        print(f"- {name} (errors {counts}): reference {text!r}")
        for arm in arms:
            print(f"  {arm} {heard[arm][i]!r}")


def errors(reference: str, transcript: str) -> int:
    """Word errors, both sides normalised as bench/listening.py does; a
    hyphen may join or part words."""
    return min(
        round(
            word_error_rate(normalised(reference, hyphen), normalised(transcript, hyphen))
            * len(words(normalised(reference, hyphen)))
        )
        for hyphen in ("", " ")
    )


def pooled_wer(results: list[Heard]) -> float:
    total = sum(len(words(normalised(r.reference))) for r in results)
    return sum(errors(r.reference, r.transcript) for r in results) / max(1, total)


def runs(rates: list[float], seeds: int, arms: list[str]) -> list[tuple[str, float, int]]:
    found = [("spliced", 0.0, 0), ("concealed", 0.0, 0)]
    found += [(arm, rate, seed) for rate in rates for seed in range(seeds) for arm in arms]
    return found


def report(results: list[Heard], rates: list[float]) -> None:
    clean = {r.name: r for r in results if r.rate == 0 and r.arm == "spliced"}
    rows = []
    for rate in [0.0, *rates]:
        for arm in ARMS:
            mine = [r for r in results if r.rate == rate and r.arm == arm]
            if not mine:
                continue
            worse = [r for r in mine if _worse(r, clean[r.name])]
            turns = [r for r in mine if r.turns != clean[r.name].turns]
            rows.append(
                [
                    f"{rate:.0%}",
                    arm,
                    len(mine),
                    f"{pooled_wer(mine):.3f}",
                    len(worse),
                    len(turns),
                    sum(r.turns == 0 for r in mine),
                ]
            )
    header = [
        "loss",
        "arm",
        "runs",
        "WER",
        f"worse by {WORSE_BY}+ words",
        "turns changed",
        "no turn",
    ]
    print(table(rows, header))
    print()
    print("The same loss patterns compared (word errors of each run, concealed against the")
    print("other arm; the sign test's two-sided p, ties left out):")
    print(table(_paired(results, rates), ["loss", "concealed vs", "fewer", "more", "same", "p"]))
    print()
    print(f"Runs worse than the loss-free transcript by {WORSE_BY} words or more, or whose")
    print("turn count changed (reference / loss-free / this run):")
    for r in results:
        base = clean[r.name]
        if r.rate and (_worse(r, base) or r.turns != base.turns):
            print(
                f"- {r.rate:.0%} {r.arm} seed {r.seed} {r.name} ({base.turns} -> {r.turns} turns): "
                f"{r.reference!r} / {base.transcript!r} / {r.transcript!r}"
            )


def _paired(results: list[Heard], rates: list[float]) -> list[list[object]]:
    errs = {(r.arm, r.rate, r.seed, r.name): errors(r.reference, r.transcript) for r in results}
    rows: list[list[object]] = []
    for rate in rates:
        for other in ("spliced", "zero-filled", "before only"):
            pairs = [
                (errs[key], errs[(other, *key[1:])])
                for key in errs
                if key[0] == "concealed" and key[1] == rate and (other, *key[1:]) in errs
            ]
            if not pairs:
                continue
            fewer = sum(mine < theirs for mine, theirs in pairs)
            more = sum(mine > theirs for mine, theirs in pairs)
            rows.append(
                [f"{rate:.0%}", other, fewer, more, len(pairs) - fewer - more, _sign_p(fewer, more)]
            )
    return rows


def _sign_p(wins: int, losses: int) -> str:
    """Two-sided exact sign test: how often a fair coin splits this unevenly."""
    n, k = wins + losses, min(wins, losses)
    if n == 0:
        return "-"
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return f"{min(1.0, 2 * tail):.2f}"


def _worse(result: Heard, clean: Heard) -> bool:
    return (
        errors(result.reference, result.transcript)
        >= errors(clean.reference, clean.transcript) + WORSE_BY
    )


async def main(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.WARNING)
    overrides: dict[str, Any] = {"turn_detection": "silence"}
    if args.stt_model:
        overrides["stt_model"] = args.stt_model
    settings = Settings(**overrides)
    utterances = split_sets()["measurement"]
    if args.match:
        utterances = [u for u in utterances if re.search(args.match, u.name)]
    utterances = utterances[: args.limit] if args.limit else utterances
    vad = registry.create("vad", settings.vad, settings)
    stt = registry.create("stt", settings.stt, settings)
    hearing = Hearing(stt, HearingStats(), "bench")
    results: list[Heard] = []
    started = time.monotonic()
    try:
        await stt.warm_up()
        for index, utterance in enumerate(utterances):
            payloads = packets(utterance)
            for arm, rate, seed in runs(args.rates, args.seeds, args.arms):
                lost = lost_packets(len(payloads), rate, seed, utterance.name)
                audio = await heard_at_16k(decoded(payloads, lost, arm))
                text, turns = await listened(audio, settings, vad, hearing)
                results.append(Heard(arm, rate, seed, utterance.name, utterance.text, text, turns))
                if args.log is not None:
                    with args.log.open("a") as lines:
                        lines.write(json.dumps(asdict(results[-1])) + "\n")
            elapsed = time.monotonic() - started
            print(f"  {index + 1}/{len(utterances)} {utterance.name} ({elapsed:.0f} s)", flush=True)
    finally:
        stt.close()
    print()
    print(
        f"{len(utterances)} utterances, {sum(len(u.audio) for u in utterances) / RATE:.0f} s; "
        f"STT {settings.stt} {settings.stt_model}, VAD {settings.vad}; "
        f"{args.seeds} seeds per loss rate"
    )
    report(results, args.rates)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.05, 0.10])
    parser.add_argument("--seeds", type=int, default=3, help="loss patterns per rate")
    parser.add_argument("--limit", type=int, default=0, help="the first N utterances only")
    parser.add_argument("--match", help="only utterances whose name matches this regex")
    parser.add_argument("--stt-model", help="faster-whisper model (default: the service's)")
    parser.add_argument("--log", type=Path, help="append each run here (JSON lines) as it ends")
    parser.add_argument("--arms", nargs="+", choices=ARMS, default=ARMS, help="at each loss rate")
    asyncio.run(main(parser.parse_args()))
