"""Turn-taking as a caller hears it, for semantic end of turn and for the
fixed silence in the same run: real recorded speech spoken in real time
into real WebRTC calls, to two servers side by side (their own processes),
each item to one and then the other, so noise on this host hits both.

- Hesitant turns: a telephone prompt of the measurement set cut at the
  widest gap between its words in its middle, with a pause of 0.5, 1.0 or
  1.5 s put there in turn (--pauses; "Please enter the number ... to be
  blacklisted").
  Counted: turns the agent talked over (its reply began before the caller
  finished) and turns split in two (two user turns committed).
- Finished sentences: whole prompts, but for the few recorded to be joined
  to a number or a name ("The number I have is"). Counted: client-measured
  voice-to-voice (end of the speech sent to the first sound received), p50
  and p95.
- Coughs over a reply: a 200 ms cough-like burst at -25 dBFS, 0.8 s into a
  reply. Counted: replies cancelled by it (false barge-ins).
- Fillers over a reply: a recorded "uh" or "um" (0.16-0.25 s of a real
  voice, bench/speech_sets.py), 0.8 s into a reply. Counted: replies
  cancelled by it.
- Interruptions over a reply: a whole prompt, 0.8 s into a reply. Counted:
  the time from the onset of the caller's speech to the reply's last sound
  received, and interruptions that did not stop it.

The prompts are Asterisk's (bench/speech_sets.py, measurement set), never
a test's. The clients run in this process at --client-nice (default 10).

    .venv/bin/python bench/turn_taking.py               # one caller
    .venv/bin/python bench/turn_taking.py --calls 5     # five at once
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from voice_agent.client import RealtimeClient
from voice_agent.rtc.call import restrict_host_addresses
from voice_agent.testing.audio_data import noise_burst, silence
from voice_agent.testing.figures import percentile, table
from voice_agent.testing.serving import servers_side_by_side

# ``python bench/<script>.py`` puts bench/ on the path, not the checkout's
# root, which the bench.* imports below are found from.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.reply_probes import last_sound_after, over_a_reply
from bench.speech_sets import filler_sounds
from bench.turn_material import CUTS, RATE, STANDS_ALONE, material

ARMS = {
    "semantic": ["--turn-detection", "semantic"],
    # The model's verdicts alone, without the embedded LLM reading the words.
    "voice-only": ["--turn-detection", "semantic", "--no-turn-words"],
    "silence": ["--turn-detection", "silence"],
    # With Whisper's live partials, which draft the STT and prefill the LLM.
    "partials": ["--turn-detection", "semantic", "--stt-partial-interval-ms", "1000"],
}
PAUSES_S = (0.5, 1.0, 1.5)
QUIET_S = 3.0  # after the speech: longer than the semantic cap, for a late reply


@dataclass
class Tally:
    # (cut, pause) -> [(talked over, split in two)]
    hesitant: dict[tuple[str, float], list[tuple[bool, bool]]] = field(default_factory=dict)
    v2v_ms: list[float] = field(default_factory=list)
    unanswered: int = 0
    coughs: list[bool] = field(default_factory=list)  # the reply was cancelled
    fillers: list[bool] = field(default_factory=list)  # the reply was cancelled
    stops_ms: list[float] = field(default_factory=list)
    not_stopped: int = 0
    no_long_reply: int = 0  # the reply to talk over never started (30 s), or had ended


async def quiet(client: RealtimeClient) -> None:
    """Cut any reply and let the line settle before the next item."""
    client.send({"type": "response.cancel"})
    await asyncio.sleep(1.0)


async def hesitant_turn(
    client: RealtimeClient, first: np.ndarray, rest: np.ndarray, pause: float
) -> tuple[bool, bool, str]:
    mark = len(client.events)
    speech_end = await client.mic.play(np.concatenate((first, silence(pause), rest)), RATE)
    await asyncio.sleep(QUIET_S)
    events = client.events[mark:]
    started = [e for e in events if e["type"] == "output_audio_buffer.started"]
    first_sound = client.received.first_sound_after(speech_end - len(rest) / RATE - pause)
    over = bool(started) and first_sound is not None and first_sound < speech_end
    split = sum(e["type"] == "input_audio_buffer.committed" for e in events) >= 2
    await quiet(client)
    return over, split, turn_details(events)


def turn_details(events: list[dict[str, Any]]) -> str:
    """The user turns' words and how each ended, for the per-item lines."""
    said = [
        repr(e["transcript"])
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    verdicts = []
    for event in events:
        if event["type"] == "response.done":
            meta = event["response"].get("metadata") or {}
            if "end_of_turn_decision" in meta:
                verdicts.append(
                    f"{meta['end_of_turn_decision']}/{meta.get('end_of_turn_verdict')}"
                    f"@{meta.get('end_of_turn_probability', '-')}"
                )
    return f"{' | '.join(said)}  [{', '.join(verdicts)}]"


async def finished_turn(client: RealtimeClient, audio: np.ndarray) -> tuple[float | None, str]:
    """Client voice-to-voice (None: no reply), and the server's account of
    the turn: how it ended and where its time went."""
    mark = len(client.events)
    speech_end = await client.mic.play(audio, RATE)
    await asyncio.sleep(QUIET_S)
    first = client.received.first_sound_after(speech_end)
    await quiet(client)  # a reply still going ends, cancelled: its response.done
    events = client.events[mark:]
    return None if first is None else (first - speech_end) * 1000, timing_details(events)


def timing_details(events: list[dict[str, Any]]) -> str:
    """The first reply's end-of-turn wait, final transcript and first token
    after the speech end (server clock), and its verdict."""
    for event in events:
        if event["type"] == "response.done":
            meta = event["response"].get("metadata") or {}
            fields = (
                ("wait", "end_of_turn_delay_ms"),
                ("heard", "stt_start_after_speech_end_ms"),
                ("stt", "stt_final_after_speech_end_ms"),
                ("llm", "llm_first_token_after_speech_end_ms"),
                ("piece", "first_piece_after_speech_end_ms"),
                ("tts", "tts_first_audio_after_speech_end_ms"),
                ("v2v", "voice_to_voice_ms"),
            )
            times = " ".join(f"{name} {meta.get(key)}" for name, key in fields)
            return (
                f"{meta.get('end_of_turn_decision')}/{meta.get('end_of_turn_verdict')}"
                f"@{meta.get('end_of_turn_probability', '-')} {times}"
            )
    return "no response.done"


async def false_barge_in(
    client: RealtimeClient, burst: np.ndarray, tally: Tally, cancels: list[bool]
) -> None:
    """``burst`` over a reply: whether it cancelled the reply goes to
    ``cancels``, or, if no reply was sounding, to the tally's count."""
    try:
        response, _, sounding = await over_a_reply(client, burst)
    except TimeoutError:
        sounding = False
    if sounding:
        cancels.append(response["status"] == "cancelled")
    else:
        tally.no_long_reply += 1
    await quiet(client)


async def caller(
    index: int,
    urls: dict[str, str],
    http: aiohttp.ClientSession,
    hesitant: list[tuple[str, np.ndarray, np.ndarray]],
    finished: list[np.ndarray],
    coughs: int,
    tallies: dict[str, Tally],
    verbose: bool,
    pauses: tuple[float, ...] = PAUSES_S,
) -> None:
    clients = {}
    for arm, url in urls.items():
        clients[arm] = RealtimeClient(url)
        await clients[arm].connect(http)
        await asyncio.wait_for(clients[arm].wait_for_type("session.created"), 20)
    shift = index % len(hesitant) if hesitant else 0
    turn_of = hesitant[shift:] + hesitant[:shift]
    for number, (name, first, rest) in enumerate(turn_of):
        pause = pauses[(number + index) % len(pauses)]
        for arm, client in clients.items():
            over, split, details = await hesitant_turn(client, first, rest, pause)
            cut = CUTS[name in STANDS_ALONE]
            tallies[arm].hesitant.setdefault((cut, pause), []).append((over, split))
            if verbose:
                marks = ("OVER " if over else "") + ("SPLIT" if split else "")
                print(f"{arm:8} {pause:.1f} s {name:24} {marks:10} {details}", flush=True)
    for number, audio in enumerate(finished):
        for arm, client in clients.items():
            v2v, details = await finished_turn(client, audio)
            if v2v is None:
                tallies[arm].unanswered += 1
            else:
                tallies[arm].v2v_ms.append(v2v)
            if verbose:
                heard = f"{v2v:.0f} ms" if v2v is not None else "no reply"
                print(f"{arm:8} finished {number:3} {heard:>9}  {details}", flush=True)
    fillers = filler_sounds() if coughs else []
    for number in range(coughs):
        for arm, client in clients.items():
            cough = noise_burst(200, -25.0, seed=number)
            await false_barge_in(client, cough, tallies[arm], tallies[arm].coughs)
        for arm, client in clients.items():
            _, filler = fillers[number % len(fillers)]
            await false_barge_in(client, filler, tallies[arm], tallies[arm].fillers)
        for arm, client in clients.items():
            interruption = finished[number % len(finished)]
            try:
                _, onset, sounding = await over_a_reply(client, interruption)
            except TimeoutError:
                sounding = False
            if not sounding:
                tallies[arm].no_long_reply += 1
                await quiet(client)
                continue
            last = last_sound_after(client, onset) or onset  # None: quiet from the onset
            if last - onset > len(interruption) / RATE:
                tallies[arm].not_stopped += 1
            else:
                tallies[arm].stops_ms.append(max(0.0, last - onset) * 1000)
            await quiet(client)
    for client in clients.values():
        await client.hangup(http)


def report(tallies: dict[str, Tally]) -> None:
    rows: list[list[Any]] = []
    pauses = sorted({pause for tally in tallies.values() for _, pause in tally.hesitant})
    for cut in CUTS:
        for arm, tally in tallies.items():
            for pause in pauses:
                results = tally.hesitant.get((cut, pause), [])
                over = sum(o for o, _ in results)
                split = sum(s for _, s in results)
                rows.append(
                    [
                        cut,
                        arm,
                        f"{pause:.1f} s",
                        f"{over}/{len(results)}",
                        f"{split}/{len(results)}",
                    ]
                )
    print(table(rows, ["cut", "arm", "pause", "talked over", "split in two"]))
    rows = []
    for arm, tally in tallies.items():
        stops = tally.stops_ms
        rows.append(
            [
                arm,
                len(tally.v2v_ms),
                f"{percentile(tally.v2v_ms, 50):.0f}" if tally.v2v_ms else "-",
                f"{percentile(tally.v2v_ms, 95):.0f}" if tally.v2v_ms else "-",
                tally.unanswered,
                f"{sum(tally.coughs)}/{len(tally.coughs)}",
                f"{sum(tally.fillers)}/{len(tally.fillers)}",
                f"{percentile(stops, 50):.0f}" if stops else "-",
                f"{max(stops):.0f}" if stops else "-",
                tally.not_stopped,
                tally.no_long_reply,
            ]
        )
    header = [
        "arm",
        "finished",
        "v2v p50",
        "p95",
        "no reply",
        "cough cancels",
        "filler cancels",
        "stop p50",
        "max",
        "not stopped",
        "reply over first",
    ]
    print()
    print(table(rows, header))


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=1, help="simultaneous callers")
    parser.add_argument("--items", type=int, default=12, help="hesitant prompts (60 at most)")
    parser.add_argument("--finished", type=int, default=12, help="finished prompts")
    parser.add_argument(
        "--coughs", type=int, default=4, help="coughs (and interruptions) per caller"
    )
    parser.add_argument(
        "--pauses",
        default=",".join(f"{p:g}" for p in PAUSES_S),
        help="the hesitant pauses in seconds, taken in turn (1.0: every prompt at 1.0 s)",
    )
    parser.add_argument("--client-nice", type=int, default=10)
    parser.add_argument(
        "--verbose", action="store_true", help="a line per turn: words, verdicts, times"
    )
    parser.add_argument("--server-arg", action="append", default=[], help="for every server")
    parser.add_argument(
        "--base-python",
        help="an arm 'base': semantic turns on the build this interpreter runs "
        "(a checkout's venv), to pair a change against the build before it",
    )
    parser.add_argument(
        "--arms",
        default="semantic,silence",
        help=f"servers side by side, from {', '.join(ARMS)}",
    )
    args = parser.parse_args()
    arms = {arm: ARMS[arm] for arm in args.arms.split(",")}
    pythons = {}
    if args.base_python:
        arms["base"] = ARMS["semantic"]
        pythons["base"] = args.base_python
    pauses = tuple(float(p) for p in args.pauses.split(","))
    hesitant, finished = material(args.items, args.finished)
    print(
        f"{len(hesitant)} hesitant prompts, {len(finished)} finished, {args.calls} caller(s)",
        flush=True,
    )
    restrict_host_addresses(["127.0.0.1"])
    async with (
        servers_side_by_side(arms, *args.server_arg, pythons=pythons) as urls,
        aiohttp.ClientSession() as http,
    ):
        os.nice(args.client_nice)
        tallies = {arm: Tally() for arm in arms}
        started = time.monotonic()
        await asyncio.gather(
            *(
                caller(
                    i, urls, http, hesitant, finished, args.coughs, tallies, args.verbose, pauses
                )
                for i in range(args.calls)
            )
        )
    print(f"\n{time.monotonic() - started:.0f} s\n")
    report(tallies)


if __name__ == "__main__":
    asyncio.run(main())
