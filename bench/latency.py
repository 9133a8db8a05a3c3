"""Voice-to-voice latency, measured by a real WebRTC client.

Starts ``voice-agent serve`` in its own process (embedded models), connects
real aiortc peers over loopback, speaks recorded human speech and measures,
on the client, the time from the end of speech in the audio it sent to the
first audible audio it received. Prints per-turn rows, p50/p95, the server's
own per-stage breakdown, and (with --calls N) pacing and memory under load.
Each turn starts 0.5 s (``--gap``) after the previous reply has finished
playing (``output_audio_buffer.stopped``), as a caller waits to hear it.

    .venv/bin/python bench/latency.py                 # 10 turns, one call
    .venv/bin/python bench/latency.py --calls 10      # 10 concurrent calls

The clients run in this process, at the server's priority by default. At a
lower one (``--client-nice 10``, as bench/load.py runs its many callers) the
client's own receive path waits while the server computes, and the time it
reads for the first audio comes late: measured on 2 cores, the client's
median exceeded the server's median first frame by 55-161 ms in five runs at
nice 10, against -71 to +32 ms in four at nice 0, while the client's own work
(about 9 % of a core) costs the server less.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from voice_agent.client import RealtimeClient
from voice_agent.rtc.call import restrict_host_addresses
from voice_agent.testing.audio_data import librivox, silence, speech_bounds
from voice_agent.testing.figures import percentile, table
from voice_agent.testing.serving import start_server, wait_ready

CLIPS = ["0880", "0930", "0890", "0920", "0870"]
STAGES = [
    ("end_of_turn_delay_ms", "end of turn"),
    ("stt_start_after_speech_end_ms", "STT start"),
    ("stt_final_after_speech_end_ms", "STT final"),
    ("llm_first_token_after_speech_end_ms", "LLM 1st token"),
    ("first_piece_after_speech_end_ms", "1st piece cut"),
    ("tts_first_audio_after_speech_end_ms", "TTS 1st audio"),
    ("voice_to_voice_ms", "1st frame sent"),
    ("server_overhead_ms", "server overhead"),
]
# How long each stage itself ran (from its own start, not from the end of speech).
DURATIONS = [
    ("stt_ms", "STT run (queue + inference)"),
    ("llm_ttft_ms", "LLM request -> 1st token"),
    ("tts_first_audio_ms", "TTS piece -> 1st audio"),
]


@dataclass
class Turn:
    call: int
    clip: str
    client_ms: float | None
    status: str
    server: dict[str, float] = field(default_factory=dict)
    speculative: bool = False


def rss_mb(pid: int) -> float:
    """Resident memory of a process and its children (the llama.cpp server)."""
    total = 0
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    for each in pids:
        for line in Path(f"/proc/{each}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


def speech_and_tail(clip: str) -> tuple[np.ndarray, np.ndarray]:
    audio = librivox(clip)
    _, end = speech_bounds(audio)
    cut = int((end + 0.02) * 16000)
    return audio[:cut], silence(1.5)


async def reply_heard(client: RealtimeClient, response_id: str, mark: int) -> None:
    """Waits until the reply's audio has been played out to this caller.
    ``response.done`` comes once the reply is generated, while its audio may
    still be playing for seconds: a caller who spoke then would be talking
    over it (a barge-in, a different measurement), and its turn would share
    the CPU with the end of the reply."""

    def about_reply(event: dict[str, Any], kinds: tuple[str, ...]) -> bool:
        return event.get("type") in kinds and event.get("response_id") == response_id

    ended = ("output_audio_buffer.stopped", "output_audio_buffer.cleared")
    try:
        # A reply's audio starts before it is done being generated; one with
        # no audio at all (failed, text only) never starts.
        await asyncio.wait_for(
            client.wait_for(lambda e: about_reply(e, ("output_audio_buffer.started",)), mark), 2
        )
        await asyncio.wait_for(client.wait_for(lambda e: about_reply(e, ended), mark), 120)
    except TimeoutError:
        return


async def spoken_turn(client: RealtimeClient, index: int, clip: str, gap_s: float) -> Turn:
    """One turn of a connected call: the clip, its reply waited for and
    heard out, then ``gap_s`` of quiet."""
    speech, tail = speech_and_tail(clip)
    mark = len(client.events)
    done = client.wait_for(lambda e: e.get("type") == "response.done", after=mark)
    speech_end = await client.mic.play(speech, 16000)
    client.mic.play(tail, 16000)
    try:
        event = await asyncio.wait_for(done, 60)
    except TimeoutError:
        return Turn(index, clip, None, "timeout")
    response = event["response"]
    await reply_heard(client, response["id"], mark)
    first = client.received.first_sound_after(speech_end)
    metadata = response.get("metadata") or {}
    turn = Turn(
        index,
        clip,
        (first - speech_end) * 1000 if first else None,
        response["status"],
        {k: float(v) for k, v in metadata.items() if _is_number(v)},
        metadata.get("speculative") == "true",
    )
    await asyncio.sleep(gap_s)
    return turn


def _is_number(value: str) -> bool:
    """The record's spans, not its words (how the turn ended, speculative)."""
    try:
        float(value)
    except ValueError:
        return False
    return True


async def connected(url: str, http: aiohttp.ClientSession) -> tuple[RealtimeClient, float]:
    """A new call, once the session exists, and its offer -> answer ms."""
    client = RealtimeClient(url)
    offered = time.monotonic()
    await client.connect(http)
    connected_at = time.monotonic()
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    return client, (connected_at - offered) * 1000


async def one_call(
    url: str, http: aiohttp.ClientSession, index: int, turns: int, gap_s: float
) -> tuple[list[Turn], dict[str, float]]:
    client, connect_ms = await connected(url, http)
    results = [
        await spoken_turn(client, index, CLIPS[(turn + index) % len(CLIPS)], gap_s)
        for turn in range(turns)
    ]
    await client.hangup(http)
    return results, {"connect_ms": connect_ms}


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=1, help="concurrent calls")
    parser.add_argument("--turns", type=int, default=10, help="turns per call")
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between turns")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="repeat the calls; memory after each round shows leaks",
    )
    parser.add_argument(
        "--client-nice",
        type=int,
        default=0,
        help="niceness of the clients (this process) once the server has started",
    )
    parser.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="extra flag for voice-agent serve (repeatable)",
    )
    args = parser.parse_args()

    restrict_host_addresses(["127.0.0.1"])
    server, url = await start_server("--max-calls", str(max(args.calls, 20)), *args.server_arg)
    # After the server is started, so it keeps its own priority; threads the
    # clients start later inherit this one's.
    os.nice(args.client_nice)
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url)
            # One warm-up turn: first-use allocations (inference arenas, the LLM's
            # buffers) are not per-call costs.
            await one_call(url, http, 0, 1, 0.0)
            await asyncio.sleep(1.0)
            idle_rss = rss_mb(server.pid)
            peak_rss = idle_rss

            async def sample_memory() -> None:
                nonlocal peak_rss
                while True:
                    peak_rss = max(peak_rss, rss_mb(server.pid))
                    await asyncio.sleep(0.5)

            sampler = asyncio.create_task(sample_memory())
            started = time.monotonic()
            outcomes: list[tuple[list[Turn], dict[str, float]]] = []
            after_rounds: list[float] = []
            for _ in range(args.rounds):
                outcomes += await asyncio.gather(
                    *(one_call(url, http, i, args.turns, args.gap) for i in range(args.calls))
                )
                await asyncio.sleep(1.0)
                after_rounds.append(rss_mb(server.pid))
            wall = time.monotonic() - started
            sampler.cancel()
            async with http.get(url + "/v1/stats") as response:
                stats = await response.json()
    finally:
        server.send_signal(signal.SIGTERM)
        await server.wait()

    turns = [t for result, _ in outcomes for t in result]
    setups = [s for _, s in outcomes]
    rows = [
        [
            t.call,
            t.clip,
            t.status,
            "yes" if t.speculative else "no",
            f"{t.client_ms:.0f}" if t.client_ms else "-",
            *[f"{t.server.get(k, float('nan')):.0f}" for k, _ in STAGES],
        ]
        for t in turns
    ]
    heading = f"{args.calls} call(s) x {args.turns} turns, {wall:.0f} s"
    print(f"\n## {heading}, clients at nice {args.client_nice}\n")
    if args.calls == 1:
        print(
            table(
                rows,
                [
                    "call",
                    "clip",
                    "status",
                    "spec",
                    "client v2v ms",
                    *[label for _, label in STAGES],
                ],
            )
        )
    answered = [t for t in turns if t.status == "completed" and t.client_ms is not None]
    client = [t.client_ms for t in answered if t.client_ms is not None]
    summary = [
        ["client voice-to-voice", f"{percentile(client, 50):.0f}", f"{percentile(client, 95):.0f}"]
    ]
    for key, label in STAGES:
        values = [t.server[key] for t in answered if key in t.server]
        if values:
            summary.append(
                [
                    f"server: {label}",
                    f"{percentile(values, 50):.0f}",
                    f"{percentile(values, 95):.0f}",
                ]
            )
    print("\n" + table(summary, ["ms after end of speech", "p50", "p95"]))
    durations = []
    for key, label in DURATIONS:
        values = [t.server[key] for t in answered if key in t.server]
        if values:
            durations.append(
                [label, f"{percentile(values, 50):.0f}", f"{percentile(values, 95):.0f}"]
            )
    if durations:
        print("\n" + table(durations, ["stage duration ms", "p50", "p95"]))
    pacing = stats["pacing"]
    # Speculative transcripts run at partial priority; shed: refused while
    # finals waited.
    stt_requests = stats.get("stt", {}).get("requests", {})
    print(
        "\n"
        + table(
            [
                ["turns answered", f"{len(answered)}/{len(turns)}"],
                *[
                    [f"turns {status}", sum(t.status == status for t in turns)]
                    for status in sorted({t.status for t in turns})
                ],
                ["turns without audio back", sum(t.client_ms is None for t in turns)],
                [
                    "STT requests: final / speculative and partial",
                    f"{stt_requests.get('final', '-')} / {stt_requests.get('partial', '-')}",
                ],
                ["speculations and partials shed", stt_requests.get("partial_skipped", "-")],
                [
                    "partials refused, the STT busy",
                    stats.get("stt", {}).get("partial_model_busy", "-"),
                ],
                ["STT decodes with a draft", stats.get("stt", {}).get("drafted", "-")],
                [
                    "offer -> answer (p50 ms)",
                    f"{statistics.median(s['connect_ms'] for s in setups):.0f}",
                ],
                ["outbound frames", pacing["frames"]],
                ["frames late > 20 ms", pacing["late_over_20ms"]],
                ["max frame lateness ms", f"{pacing['max_late_ms']:.1f}"],
                ["server RSS idle MB", f"{idle_rss:.0f}"],
                ["server RSS peak MB", f"{peak_rss:.0f}"],
                ["extra MB per call", f"{(peak_rss - idle_rss) / args.calls:.1f}"],
                *[
                    [f"server RSS after round {i + 1} MB", f"{mb:.0f}"]
                    for i, mb in enumerate(after_rounds)
                ],
            ],
            ["", "value"],
        )
    )
    print(
        json.dumps(
            {
                "calls": args.calls,
                "turns": len(turns),
                "answered": len(answered),
                "client_p50": percentile(client, 50),
                "client_p95": percentile(client, 95),
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
