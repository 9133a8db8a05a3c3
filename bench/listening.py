"""How well the agent listens: real recorded speech it was not tuned on,
spoken into real calls over Opus and over G.711 (PCMU, 8 kHz), for the
default STT and for ``--stt-window full`` in the same run.

The speech and which of it is the tuning set and which the measurement
set: bench/speech_sets.py (several speakers, telephone prompts at 8 kHz,
spontaneous speech with pauses and fillers, odd voice qualities, read
books).

Both servers run side by side (their own processes); each utterance is
spoken to one, then to the other, so noise on this host hits both arms. The
clients run in this process at --client-nice (default 10). Per arm and
codec it prints WER (both sides normalised alike: digits as words, no
fillers; an utterance the agent took as two turns is scored on their
transcripts joined), utterances with no reply, unheard ones (transcription
failed: the caller was asked to repeat), empty and truncated transcripts,
utterances split into two turns or more (the end of turn taken at a pause
inside), and client-measured voice-to-voice, and lists every utterance that
failed.

    .venv/bin/python bench/listening.py                 # the measurement set
    .venv/bin/python bench/listening.py --limit 30      # its first 30
    .venv/bin/python bench/listening.py --match '^mfa|^libri'  # not Asterisk
    .venv/bin/python bench/listening.py --set tuning
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from voice_agent.client import RealtimeClient
from voice_agent.rtc.call import restrict_host_addresses
from voice_agent.testing.audio_data import silence, word_error_rate, words
from voice_agent.testing.figures import percentile, table
from voice_agent.testing.serving import servers_side_by_side

# ``python bench/<script>.py`` puts bench/ on the path, not the checkout's
# root, which the bench.* imports below are found from.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.speech_sets import Utterance, normalised, source, split_sets

CODECS = ["audio/opus", "audio/PCMU"]
ARMS = {"default": [], "full window": ["--stt-window", "full"]}
TURN_TIMEOUT_S = 30
TRANSCRIBED = "conversation.item.input_audio_transcription.completed"
UNHEARD = "conversation.item.input_audio_transcription.failed"


@dataclass
class Result:
    arm: str
    codec: str
    name: str
    reference: str
    transcript: str | None  # None: the transcription failed
    replied: bool = False
    v2v_ms: float | None = None
    # Why no reply came: the reply's status and reason, or "timeout".
    outcome: str | None = None
    turns: int = 1  # user turns the utterance made (2+: the agent took a pause for its end)


async def spoken(
    client: RealtimeClient, utterance: Utterance
) -> tuple[str | None, bool, float | None, str | None, int]:
    """One utterance: its transcript (its turns' joined; None if one failed
    and none had words), whether the last turn got a reply, the client's
    voice-to-voice, why no reply came, and how many user turns it made.
    The reply is cut once its first sound has arrived, so the next
    utterance starts at once."""
    mark = len(client.events)
    speech_end = await client.mic.play(utterance.audio, 16000)
    client.mic.play(silence(2.5), 16000)  # longer than the semantic cap

    def count(kind: str) -> int:
        return sum(e.get("type") == kind for e in client.events[mark:])

    def settled() -> bool:
        """Every turn it made has ended and has its transcript."""
        started = count("input_audio_buffer.speech_started")
        stopped = count("input_audio_buffer.speech_stopped")
        committed = count("input_audio_buffer.committed")  # sent just after its stop
        heard = count(TRANSCRIBED) + count(UNHEARD)
        return 0 < started <= stopped <= committed <= heard

    try:
        while not settled():
            await asyncio.wait_for(
                client.wait_for(lambda e: True, after=len(client.events)), TURN_TIMEOUT_S
            )
    except TimeoutError:
        return None, False, None, "timeout", count("input_audio_buffer.committed")
    turns = count("input_audio_buffer.committed")
    texts = [e.get("transcript", "") for e in client.events[mark:] if e["type"] == TRANSCRIBED]
    transcript = " ".join(t.strip() for t in texts) if texts else None
    last_turn = max(
        i for i, e in enumerate(client.events) if e["type"] == "input_audio_buffer.committed"
    )
    sounding = client.wait_for(
        lambda e: e.get("type") in ("output_audio_buffer.started", "response.done"),
        after=last_turn,
    )
    try:
        started = await asyncio.wait_for(sounding, TURN_TIMEOUT_S)
    except TimeoutError:
        return transcript, False, None, "timeout", turns
    if started["type"] == "output_audio_buffer.started":
        # Long enough for the first sound to arrive, then the rest is cut.
        done = client.wait_for(lambda e: e.get("type") == "response.done", after=last_turn)
        await asyncio.sleep(0.5)
        client.send({"type": "response.cancel"})
        await asyncio.wait_for(done, TURN_TIMEOUT_S)
    first = client.received.first_sound_after(speech_end)
    replied = started["type"] == "output_audio_buffer.started" and transcript is not None
    await asyncio.sleep(0.3)
    outcome = None
    if not replied:
        response = started.get("response", {})
        details = response.get("status_details") or {}
        outcome = f"{response.get('status')}/{details.get('reason')}"
    v2v = (first - speech_end) * 1000 if first else None
    return transcript, replied, v2v, outcome, turns


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
                    transcript, replied, v2v, outcome, turns = await spoken(client, utterance)
                    result = Result(arm, codec, utterance.name, utterance.text, transcript)
                    result.replied, result.v2v_ms, result.outcome = replied, v2v, outcome
                    result.turns = turns
                    results.append(result)
                    if log is not None:
                        with log.open("a") as lines:
                            lines.write(json.dumps(dataclasses.asdict(result)) + "\n")
                print(f"  {codec} {index + 1}/{len(utterances)} {utterance.name}", flush=True)
            for client in clients.values():
                await client.hangup(http)
    return results


def wer(result: Result) -> float:
    """Both sides normalised the same way (digits as words, no fillers);
    a hyphen may join or part words ("cold-hearted" is right for "cold
    hearted", "deactivated" for "De-activated")."""
    hypothesis = result.transcript or ""
    return min(
        word_error_rate(normalised(result.reference, hyphen), normalised(hypothesis, hyphen))
        for hyphen in ("", " ")
    )


def truncated(result: Result) -> bool:
    """The transcript lost the reference's last word(s)."""
    ref, hyp = words(normalised(result.reference)), words(normalised(result.transcript or ""))
    return bool(hyp) and len(hyp) < len(ref) and hyp[-1] != ref[-1]


def _pooled_wer(results: list[Result]) -> float:
    errors = sum(wer(r) * len(words(normalised(r.reference))) for r in results)
    return errors / max(1, sum(len(words(normalised(r.reference))) for r in results))


def report(results: list[Result]) -> None:
    rows = []
    for arm in ARMS:
        for codec in CODECS:
            mine = [r for r in results if r.arm == arm and r.codec == codec]
            v2v = [r.v2v_ms for r in mine if r.v2v_ms is not None]
            rows.append(
                [
                    arm,
                    codec.split("/")[1],
                    len(mine),
                    f"{_pooled_wer(mine):.3f}",
                    sum(not r.replied for r in mine),
                    sum(r.transcript is None for r in mine),
                    sum(not (r.transcript or "").strip() for r in mine),
                    sum(truncated(r) for r in mine),
                    sum(r.turns > 1 for r in mine),
                    f"{percentile(v2v, 50):.0f}" if v2v else "-",
                    f"{percentile(v2v, 95):.0f}" if v2v else "-",
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
        "split",
        "v2v p50",
        "p95",
    ]
    print(table(rows, header))
    sources = sorted({source(r.name) for r in results})
    by_source = []
    for kind in sources:
        row: list[object] = [kind, len({r.name for r in results if source(r.name) == kind})]
        for arm in ARMS:
            for codec in CODECS:
                mine = [
                    r
                    for r in results
                    if r.arm == arm and r.codec == codec and source(r.name) == kind
                ]
                row.append(f"{_pooled_wer(mine):.3f}" if mine else "-")
        by_source.append(row)
    columns = [f"{arm} {codec.split('/')[1]}" for arm in ARMS for codec in CODECS]
    print("\nWER by kind of speech:\n")
    print(table(by_source, ["speech", "utterances", *columns]))
    failed = [r for r in results if wer(r) > 0.25]
    if failed:
        print("\nUtterances with WER > 0.25 (or no transcript):")
        for r in failed:
            print(f"- {r.arm}, {r.codec}, {r.name}: {r.reference!r} -> {r.transcript!r}")
    unanswered = [r for r in results if not r.replied]
    if unanswered:
        print("\nTurns with no reply (the reply's status/reason):")
        for r in unanswered:
            print(f"- {r.arm}, {r.codec}, {r.name}: {r.outcome}, heard {r.transcript!r}")


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--set", choices=["measurement", "tuning"], default="measurement")
    parser.add_argument("--limit", type=int, default=0, help="only the first N utterances")
    parser.add_argument("--skip", type=int, default=0, help="leave out the first N utterances")
    parser.add_argument("--only", action="append", default=[], help="only this one (repeatable)")
    parser.add_argument("--match", help="only utterances whose name matches this regex")
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
    if args.match:
        utterances = [u for u in utterances if re.search(args.match, u.name)]
    utterances = utterances[args.skip :]
    if args.limit:
        utterances = utterances[: args.limit]
    print(f"{args.set} set: {len(utterances)} utterances", flush=True)
    restrict_host_addresses(["127.0.0.1"])
    async with servers_side_by_side(ARMS, *args.server_arg) as urls:
        os.nice(args.client_nice)
        started = time.monotonic()
        if args.json:
            args.json.write_text("")
        results = await run(urls, utterances, args.json)
        print(f"\n{len(results)} turns in {time.monotonic() - started:.0f} s\n")
        report(results)


if __name__ == "__main__":
    asyncio.run(main())
