"""How well the agent listens: real recorded speech it was not tuned on,
spoken into real calls over Opus and over G.711 (PCMU, 8 kHz), for the
default STT and for ``--stt-window full`` in the same run.

The speech: Asterisk's English core sounds (Allison Smith, 8 kHz telephone
prompts, CC-BY-SA 3.0, from Debian's asterisk-core-sounds-en-wav and -en,
fetched with ``apt-get download``), many of them two sentences with a pause
between, and the LibriVox recordings of tests/data (another speaker). The
prompts split in two sets that never mix:

- tuning: every TUNING_STRIDE-th of the 2-7 s prompts, the set the trimmed
  window's faults were found and fixed on (and the four in tests/data);
- measurement: all the other 1-10 s prompts, printed here.

Both servers run side by side (their own processes); each utterance is
spoken to one, then to the other, so noise on this host hits both arms. The
clients run in this process at --client-nice (default 10). Per arm and
codec it prints WER (digits and symbols read as words on both sides), turns
with no reply, unheard turns (transcription failed: the caller was asked to
repeat), empty and truncated transcripts and client-measured voice-to-voice,
and lists every utterance that failed.

    .venv/bin/python bench/listening.py                 # the measurement set
    .venv/bin/python bench/listening.py --limit 30      # its first 30
    .venv/bin/python bench/listening.py --set tuning
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gzip
import json
import os
import re
import signal
import subprocess
import sys
import time
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import soxr

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.latency import pct, table  # noqa: E402
from bench.serving import start_server, wait_ready  # noqa: E402
from tests.audio_data import (  # noqa: E402
    ASTERISK,
    librivox,
    reference,
    silence,
    speech_bounds,
    word_error_rate,
    words,
)
from voice_agent.client import RealtimeClient  # noqa: E402
from voice_agent.rtc.call import restrict_host_addresses  # noqa: E402

CACHE = ROOT / ".cache" / "speech"
PACKAGES = ["asterisk-core-sounds-en-wav", "asterisk-core-sounds-en"]
SOUNDS = "usr/share/asterisk/sounds/en_US_f_Allison"
TEXTS = "usr/share/doc/asterisk-core-sounds-en/core-sounds-en.txt.gz"
TUNING_STRIDE = 4
CODECS = ["audio/opus", "audio/PCMU"]
ARMS = {"default": [], "full window": ["--stt-window", "full"]}
TURN_TIMEOUT_S = 30


@dataclass
class Utterance:
    name: str
    text: str
    audio: np.ndarray  # 16 kHz int16


@dataclass
class Result:
    arm: str
    codec: str
    name: str
    reference: str
    transcript: str | None  # None: the transcription failed
    replied: bool
    v2v_ms: float | None


def fetch_prompts() -> Path:
    """Asterisk's prompts and their text, unpacked under .cache/speech."""
    if not (CACHE / SOUNDS).is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(["apt-get", "download", *PACKAGES], cwd=CACHE, check=True)
        for deb in CACHE.glob("*.deb"):
            subprocess.run(["dpkg-deb", "-x", str(deb), str(CACHE)], check=True)
    return CACHE


def _normalised(text: str) -> str:
    """Digits and symbols spoken as words, as the prompts say them."""
    names = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
    text = text.replace("#", " pound ").replace("*", " star ")
    return re.sub(r"\d", lambda m: f" {names[int(m.group())]} ", text)


def prompts() -> list[tuple[str, str, np.ndarray, float]]:
    """Every spoken prompt (name, text, 16 kHz audio trimmed as a turn, seconds)."""
    root = fetch_prompts()
    found = []
    with gzip.open(root / TEXTS, "rt") as lines:
        listed = list(lines)
    for line in listed:
        match = re.match(r"^([\w/-]+): (.*)$", line.strip())
        if not match or "[" in match.group(2) or "(" in match.group(2):
            continue
        path = root / SOUNDS / f"{match.group(1)}.wav"
        if not path.exists():
            continue
        with wave.open(str(path)) as handle:
            narrow = np.frombuffer(handle.readframes(handle.getnframes()), dtype=np.int16)
        wide = soxr.resample(narrow, 8000, 16000).astype(np.int16)
        start, end = speech_bounds(wide)
        audio = wide[max(0, int((start - 0.3) * 16000)) : int((end + 0.05) * 16000)]
        found.append((match.group(1), _normalised(match.group(2)), audio, len(narrow) / 8000))
    return sorted(found, key=lambda item: item[0])


def split_sets() -> dict[str, list[Utterance]]:
    everything = prompts()
    middling = [p for p in everything if 2.0 <= p[3] <= 7.0 and not re.search(r"\d", p[1])]
    tuning_names = {p[0] for p in middling[:: max(1, len(middling) // 64)][:64]} | set(ASTERISK)
    tuning = [Utterance(n, t, a) for n, t, a, _ in everything if n in tuning_names]
    measured = [
        Utterance(n, t, a)
        for n, t, a, d in everything
        if n not in tuning_names and 1.0 <= d <= 10.0 and len(words(t)) >= 2
    ]
    measured += [Utterance(f"librivox-{c}", reference(c), librivox(c)) for c in ("0870", "0890")]
    return {"tuning": tuning, "measurement": measured}


async def spoken(
    client: RealtimeClient, utterance: Utterance
) -> tuple[str | None, bool, float | None]:
    """One turn: the transcript (None if it failed), whether a reply came,
    and the client's voice-to-voice; the reply is cut once its first sound
    has arrived, so the next turn starts at once."""
    mark = len(client.events)
    kinds = (
        "conversation.item.input_audio_transcription.completed",
        "conversation.item.input_audio_transcription.failed",
    )
    heard = client.wait_for(lambda e: e.get("type") in kinds, after=mark)
    done = client.wait_for(lambda e: e.get("type") == "response.done", after=mark)
    speech_end = await client.mic.play(utterance.audio, 16000)
    client.mic.play(silence(1.5), 16000)
    event = await asyncio.wait_for(heard, TURN_TIMEOUT_S)
    transcript = event.get("transcript") if event["type"] == kinds[0] else None
    try:
        response = (await asyncio.wait_for(done, TURN_TIMEOUT_S))["response"]
    except TimeoutError:
        return transcript, False, None
    first = client.received.first_sound_after(speech_end)
    replied = response["status"] == "completed" and transcript is not None
    await asyncio.sleep(0.3)
    return transcript, replied, (first - speech_end) * 1000 if first else None


async def run(
    arm_urls: dict[str, str], utterances: list[Utterance], log: Path | None
) -> list[Result]:
    """Every turn; each also appended to ``log`` (JSON lines) as it ends, so
    a run stopped early keeps what it measured."""
    results: list[Result] = []
    async with aiohttp.ClientSession() as http:
        for codec in CODECS:
            clients = {}
            for arm, url in arm_urls.items():
                clients[arm] = RealtimeClient(url, codec=codec)
                await clients[arm].connect(http)
                await asyncio.wait_for(clients[arm].wait_for_type("session.created"), 10)
            for index, utterance in enumerate(utterances):
                for arm, client in clients.items():
                    transcript, replied, v2v = await spoken(client, utterance)
                    result = Result(
                        arm, codec, utterance.name, utterance.text, transcript, replied, v2v
                    )
                    results.append(result)
                    if log is not None:
                        with log.open("a") as lines:
                            lines.write(json.dumps(dataclasses.asdict(result)) + "\n")
                print(f"  {codec} {index + 1}/{len(utterances)} {utterance.name}", flush=True)
            for client in clients.values():
                await client.hangup(http)
    return results


def wer(result: Result) -> float:
    """Both sides with digits and symbols as words ("3D" is "three d")."""
    return word_error_rate(result.reference, _normalised(result.transcript or ""))


def truncated(result: Result) -> bool:
    """The transcript lost the reference's last word(s)."""
    ref, hyp = words(result.reference), words(_normalised(result.transcript or ""))
    return bool(hyp) and len(hyp) < len(ref) and hyp[-1] != ref[-1]


def report(results: list[Result]) -> None:
    rows = []
    for arm in ARMS:
        for codec in CODECS:
            mine = [r for r in results if r.arm == arm and r.codec == codec]
            errors = sum(wer(r) * len(words(r.reference)) for r in mine)
            total_words = sum(len(words(r.reference)) for r in mine)
            v2v = [r.v2v_ms for r in mine if r.v2v_ms is not None]
            rows.append(
                [
                    arm,
                    codec.split("/")[1],
                    len(mine),
                    f"{errors / max(1, total_words):.3f}",
                    sum(not r.replied for r in mine),
                    sum(r.transcript is None for r in mine),
                    sum(not (r.transcript or "").strip() for r in mine),
                    sum(truncated(r) for r in mine),
                    f"{pct(v2v, 50):.0f}" if v2v else "-",
                    f"{pct(v2v, 95):.0f}" if v2v else "-",
                ]
            )
    header = [
        "arm",
        "codec",
        "turns",
        "WER",
        "no reply",
        "unheard",
        "empty",
        "truncated",
        "v2v p50",
        "p95",
    ]
    print(table(rows, header))
    failed = [r for r in results if wer(r) > 0.25]
    if failed:
        print("\nUtterances with WER > 0.25 (or no transcript):")
        for r in failed:
            print(f"- {r.arm}, {r.codec}, {r.name}: {r.reference!r} -> {r.transcript!r}")


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--set", choices=["measurement", "tuning"], default="measurement")
    parser.add_argument("--limit", type=int, default=0, help="only the first N utterances")
    parser.add_argument("--only", action="append", default=[], help="only this one (repeatable)")
    parser.add_argument("--client-nice", type=int, default=10)
    parser.add_argument("--json", type=Path, help="also write each turn's result here (lines)")
    parser.add_argument(
        "--report", type=Path, help="only print the report of an earlier run's --json lines"
    )
    parser.add_argument("--server-arg", action="append", default=[], help="for both servers")
    args = parser.parse_args()
    if args.report:
        lines = args.report.read_text().splitlines()
        report([Result(**json.loads(line)) for line in lines if line.strip()])
        return
    utterances = split_sets()[args.set]
    if args.only:
        utterances = [u for u in utterances if u.name in args.only]
    if args.limit:
        utterances = utterances[: args.limit]
    print(f"{args.set} set: {len(utterances)} utterances", flush=True)
    restrict_host_addresses(["127.0.0.1"])
    servers: dict[str, tuple[Any, str]] = {}
    try:
        for arm, flags in ARMS.items():
            servers[arm] = await start_server(*flags, *args.server_arg)
        async with aiohttp.ClientSession() as http:
            for _, url in servers.values():
                await wait_ready(http, url)
        os.nice(args.client_nice)
        started = time.monotonic()
        if args.json:
            args.json.write_text("")
        urls = {arm: url for arm, (_, url) in servers.items()}
        results = await run(urls, utterances, args.json)
        print(f"\n{len(results)} turns in {time.monotonic() - started:.0f} s\n")
        report(results)
    finally:
        for process, _ in servers.values():
            process.send_signal(signal.SIGINT)
            await process.wait()


if __name__ == "__main__":
    asyncio.run(main())
