"""Word error rate and turn counts of real calls, over many utterances.

bench/narrowband_wer.py speaks five clips (about 100 words, a word is a
point of WER); a 2-point target needs more. This speaks measurement-set
utterances (bench/speech_sets.py: telephone prompts, spontaneous speech,
odd voices, read books; never the tuning set) into real calls: one call a
codec (Opus, PCMU, PCMA), the three at once, each utterance in turn in the
same call, the next one once every turn the last one started has its
transcript. A turn is scored with the utterance it started in, by the
server's audio clock (its ``audio_start_ms``): on a lossy network the data
channel's events can come seconds late, behind a retransmission. The
server runs its defaults (semantic end of turn); each session asks for
no replies (``create_response: false``), so the caller is never heard
over the agent (on a G.711 line, AEC3 takes 11-14 dB off a caller who
talks over the agent before the line is found free of echo:
audio/echo_presence.py) and no LLM is needed.

The Opus caller codes no FEC unless told the loss (``--client-fec-loss``):
a browser codes in-band FEC where the answer asks for it (every answer
here does) once RTCP tells it the link's loss; aiortc never does.

Each run appends one JSON line per utterance to ``--log``; ``--report``
reads such a log and prints, per loss label and codec, the WER pooled over
words, and against the ``0`` label's run of the same utterance: how many
came out two or more words worse, and how many were taken as another
number of turns (a gap cutting a turn, or two turns merged).

    .venv/bin/python bench/call_wer.py --items 80 --label 0 --log /tmp/wer.jsonl
    sudo bash bench/lossy_network.sh 0 5 10 -- bench/call_wer.py --items 80 \
        --label {rate} --log /tmp/wer.jsonl
    sudo bash bench/lossy_network.sh 10 -- bench/call_wer.py --items 80 \
        --label {rate}-fec --client-fec-loss {rate} --log /tmp/wer.jsonl
    .venv/bin/python bench/call_wer.py --report /tmp/wer.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from voice_agent.client import RealtimeClient
from voice_agent.rtc.call import restrict_host_addresses
from voice_agent.testing.audio_data import silence, words
from voice_agent.testing.figures import table
from voice_agent.testing.serving import start_server, wait_ready

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench.packet_loss import WORSE_BY, errors
from bench.speech_sets import Utterance, normalised, split_sets

CODECS = ["audio/opus", "audio/PCMU", "audio/PCMA"]
RATE = 16_000
GAP_S = 0.6  # silence after each utterance, before the next one
SETTLE_S = 0.5  # after the audio: a turn it started has been announced
LATE_EVENTS_S = 5.0  # after the last utterance: events held back by retransmission
MIC_RATE = 48_000  # the client's stream clock (voice_agent/client.py)
TURN_TIMEOUT_S = 20.0  # the cap (2 s) and a transcription, with room
PLAY_SLACK_S = 10.0  # an utterance's audio this much later than real time: the call is gone
NO_REPLIES = {"type": "semantic_vad", "create_response": False}
STARTED = "input_audio_buffer.speech_started"
ENDED = (
    "conversation.item.input_audio_transcription.completed",
    "conversation.item.input_audio_transcription.failed",
)


def chosen(items: int) -> list[Utterance]:
    """``items`` utterances spread evenly over the measurement set."""
    everything = split_sets()["measurement"]
    if items >= len(everything):
        return everything
    step = len(everything) / items
    return [everything[int(i * step)] for i in range(items)]


async def turns_settled(client: RealtimeClient, after: int) -> None:
    """Until every turn started since event ``after`` has its transcript."""

    def settled(_: dict[str, Any]) -> bool:
        events = client.events[after:]
        started = sum(e.get("type") == STARTED for e in events)
        ended = sum(e.get("type") in ENDED for e in events)
        return bool(started == ended)

    if settled({}):
        return
    await client.wait_for(settled, after)


async def speak_all(
    http: aiohttp.ClientSession,
    url: str,
    codec: str,
    utterances: list[Utterance],
    fec_loss: int = 0,
) -> list[dict[str, Any]]:
    client = RealtimeClient(url, codec=codec, opus_fec_loss=fec_loss)
    spans: list[tuple[float, float]] = []  # each utterance's speech, ms into the mic's stream
    timed_out: list[bool] = []
    try:
        await client.connect(http)
        updated = client.wait_for_type("session.updated")
        client.send(
            {
                "type": "session.update",
                "session": {
                    "type": "realtime",
                    "audio": {"input": {"turn_detection": NO_REPLIES}},
                },
            }
        )
        await asyncio.wait_for(updated, 10)
        for utterance in utterances:
            after = len(client.events)
            start_ms = client.mic.position() * 1000 / MIC_RATE
            audio = np.concatenate((utterance.audio, silence(GAP_S)))
            # A call that died (its sender no longer takes the microphone's
            # frames) would leave this waiting for good: a bench error instead.
            played = client.mic.play(audio, RATE)
            try:
                await asyncio.wait_for(played, len(audio) / RATE + PLAY_SLACK_S)
            except TimeoutError:
                raise RuntimeError(f"{codec}: the call stopped taking audio") from None
            spans.append((start_ms, start_ms + len(utterance.audio) * 1000 / RATE))
            await asyncio.sleep(SETTLE_S)
            try:
                await asyncio.wait_for(turns_settled(client, after), TURN_TIMEOUT_S)
                timed_out.append(False)
            except TimeoutError:
                timed_out.append(True)
        # Events a lossy data channel held back (SCTP retransmits them, in order).
        await asyncio.sleep(LATE_EVENTS_S)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(turns_settled(client, 0), TURN_TIMEOUT_S)
    finally:
        await client.hangup(http)
    # Each turn goes to the utterance whose speech it started in (by the
    # server's audio clock), not to the one playing when its events came.
    owner: dict[str, int] = {}
    for event in client.of_type(STARTED):
        at = float(event["audio_start_ms"])
        owner[str(event["item_id"])] = min(
            range(len(spans)), key=lambda i: max(spans[i][0] - at, at - spans[i][1], 0.0)
        )
    texts: list[list[str]] = [[] for _ in utterances]
    turns = [0] * len(utterances)
    for index in owner.values():
        turns[index] += 1
    for event in client.of_type(ENDED[0]):
        said = owner.get(str(event["item_id"]))
        if said is not None and str(event["transcript"]).strip():
            texts[said].append(str(event["transcript"]).strip())
    return [
        {
            "utterance": utterance.name,
            "codec": codec.split("/")[1],
            "reference": utterance.text,
            "transcript": " ".join(texts[i]),
            "turns": turns[i],
            "timed_out": timed_out[i],
        }
        for i, utterance in enumerate(utterances)
    ]


async def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    restrict_host_addresses(["127.0.0.1"])
    utterances = chosen(args.items)
    process, url = await start_server(
        "--llm-base-url", "http://127.0.0.1:9/v1", "--log-level", "ERROR", *args.flags
    )
    started = time.monotonic()
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url)
            results = await asyncio.gather(
                *(speak_all(http, url, c, utterances, args.client_fec_loss) for c in CODECS)
            )
    finally:
        process.send_signal(signal.SIGINT)
        await process.wait()
    print(f"{len(utterances)} utterances, 3 calls at once, {time.monotonic() - started:.0f} s")
    return [{**row, "label": args.label} for codec_rows in results for row in codec_rows]


def report(rows: list[dict[str, Any]]) -> None:
    by_run: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_run[(row["label"], row["codec"])].append(row)
    clean = {
        (row["codec"], row["utterance"]): row for row in rows if row["label"] == "0"
    }  # the loss-free run, when the log has one
    lines = []
    for (label, codec), runs in sorted(by_run.items()):
        total = sum(len(words(normalised(r["reference"]))) for r in runs)
        wrong = sum(errors(r["reference"], r["transcript"]) for r in runs)
        paired = [
            (r, clean[(codec, r["utterance"])]) for r in runs if (codec, r["utterance"]) in clean
        ]
        worse = sum(
            errors(r["reference"], r["transcript"]) - errors(c["reference"], c["transcript"])
            >= WORSE_BY
            for r, c in paired
        )
        other_turns = sum(r["turns"] != c["turns"] for r, c in paired)
        lines.append(
            [
                label,
                codec,
                len(runs),
                total,
                f"{wrong / max(1, total):.3f}",
                worse if paired else "-",
                other_turns if paired else "-",
                sum(r["turns"] == 0 for r in runs),
                sum(r["timed_out"] for r in runs),
            ]
        )
    header = ["loss", "codec", "utterances", "words", "WER", "worse by 2+", "other turns"]
    print(table(lines, [*header, "no turn", "timed out"]))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=80, help="measurement-set utterances")
    parser.add_argument("--label", default="0", help="this run's loss, as the log records it")
    parser.add_argument("--log", help="append each utterance's result here (JSON lines)")
    parser.add_argument("--report", help="print the table of a log instead of running")
    parser.add_argument(
        "--client-fec-loss",
        type=int,
        default=0,
        help="the Opus caller codes in-band FEC for this %% of packets lost, as a browser "
        "does once RTCP reports the loss (0: none, as aiortc)",
    )
    parser.add_argument("flags", nargs="*", help="more voice-agent serve flags, after --")
    args = parser.parse_args()
    if args.report:
        report([json.loads(line) for line in Path(args.report).read_text().splitlines()])
    else:
        rows = asyncio.run(run(args))
        if args.log:
            with open(args.log, "a") as log:
                log.writelines(json.dumps(row) + "\n" for row in rows)
        report(rows)
