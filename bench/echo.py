"""False barge-ins on a speakerphone, with and without echo cancellation.

Starts ``voice-agent serve`` (embedded models) once per setting of
``--echo-cancel``, and calls it with real aiortc clients that offer G.711, as
a phone gateway does, and act as a speakerphone without echo cancellation
(``voice_agent.client.SimulatedEcho``: what they receive comes back into their
microphone 150 ms later through a small room, at the level given).

Per setting and echo level, one call of several turns: the caller asks a
question and then says nothing (with --step-ms, the echo's delay steps by
that much, up and then down in turn, one second into each reply). Counted
per reply:
- false barge-in: the reply was cancelled by a "turn" the caller never spoke;
- phantom turns: speech the server detected while the caller was silent.
Then real barge-ins: the caller speaks a recorded sentence (and, with
--short-barge-ins, a one-word "no") one second into a long reply; counted
are replies cut (as they must be; a reply that ended of itself before the
caller finished is left out) and the word error rate of what the caller
said, against a clean line (no echo at all). With --calls N, N such
callers at once, each with its own echo, the table summing them.

    .venv/bin/python bench/echo.py
    .venv/bin/python bench/echo.py --settings on --step-ms 40 --turns 8
    .venv/bin/python bench/echo.py --settings on --step-ms 40 --calls 4 --barge-ins 2
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import numpy as np

from voice_agent.client import RealtimeClient, SimulatedEcho
from voice_agent.rtc.call import restrict_host_addresses
from voice_agent.testing.audio_data import (
    librivox,
    reference,
    silence,
    telephone_prompt,
    word_error_rate,
)
from voice_agent.testing.figures import table
from voice_agent.testing.serving import start_server, wait_ready

QUESTIONS = ["0930", "0890", "0920", "0870"]
BARGE_IN = "0880"
RATE = 16_000


@dataclass
class QuietTurns:
    replies: int = 0
    false_barge_ins: int = 0
    phantom_turns: int = 0
    heard: list[str] = field(default_factory=list)  # what the phantom turns were heard as


@dataclass
class BargeIns:
    tried: int = 0  # the reply was still playing when the caller finished
    cut: int = 0
    ended: int = 0  # the reply ended before the caller had finished
    wer: list[float] = field(default_factory=list)
    heard: list[str] = field(default_factory=list)


def summed(results: list[QuietTurns] | list[BargeIns]) -> Any:
    """One result of several callers' (the same kind), counts added up."""
    first = results[0]
    total = type(first)()
    for result in results:
        for name, value in vars(result).items():
            setattr(total, name, getattr(total, name) + value)
    return total


def details_reason(response: dict[str, Any]) -> str | None:
    reason = (response.get("status_details") or {}).get("reason")
    return None if reason is None else str(reason)


def transcripts_since(client: RealtimeClient, first_event: int) -> list[str]:
    return [
        str(event["transcript"])
        for event in client.events[first_event:]
        if event["type"] == "conversation.item.input_audio_transcription.completed"
    ]


def reply_text(response: dict[str, Any]) -> str:
    return " ".join(
        str(part.get("transcript") or part.get("text") or "")
        for item in response.get("output") or []
        for part in item.get("content") or []
    )


def ended_before(client: RealtimeClient, first_event: int, t: float) -> bool:
    """Whether the reply's audio stopped of itself before ``t``."""
    return any(
        event["type"] == "output_audio_buffer.stopped" and at < t
        for event, at in zip(
            client.events[first_event:], client.event_times[first_event:], strict=True
        )
    )


def speech_started_after(client: RealtimeClient, t: float) -> int:
    return sum(
        1
        for event, at in zip(client.events, client.event_times, strict=True)
        if event["type"] == "input_audio_buffer.speech_started" and at > t
    )


async def settle(client: RealtimeClient) -> None:
    """End whatever the echo set off before the next turn."""
    client.send({"type": "response.cancel"})
    client.send({"type": "output_audio_buffer.clear"})
    await asyncio.sleep(1.5)


async def quiet_turns(
    url: str, http: aiohttp.ClientSession, echo_db: float, turns: int, step_ms: float = 0.0
) -> QuietTurns:
    result = QuietTurns()
    echo = SimulatedEcho(150, echo_db)
    client = RealtimeClient(url, codec="audio/PCMU", echo=echo)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    for turn in range(turns):
        clip = QUESTIONS[turn % len(QUESTIONS)]
        first_event = len(client.events)
        playing = client.wait_for_type("output_audio_buffer.started", after=len(client.events))
        done = client.wait_for_type("response.done", after=len(client.events))
        sent = await client.mic.play(np.concatenate((librivox(clip), silence(0.3))), RATE)
        try:
            if step_ms:
                await asyncio.wait_for(playing, 40)
                await asyncio.sleep(1.0)
                echo.step(step_ms if turn % 2 == 0 else -step_ms)
            response = (await asyncio.wait_for(done, 40))["response"]
        except TimeoutError:
            continue
        await asyncio.sleep(2.0)  # the echo of the reply's end comes back
        result.replies += 1
        details = response.get("status_details") or {}
        if response["status"] == "cancelled" and details.get("reason") == "turn_detected":
            result.false_barge_ins += 1
        result.phantom_turns += speech_started_after(client, sent)
        # The first transcript is the caller's question; any after it, the echo's.
        phantoms = transcripts_since(client, first_event)[1:]
        if phantoms:
            cut = "cut" if details.get("reason") == "turn_detected" else "not cut"
            # The canceller's counts so far this call: a realignment (the
            # pacer late) or a delay change near a cut is a lead to its cause.
            async with http.get(client.call_url) as status:
                state = (await status.json()).get("echo_cancel") or {}
            counts = ", ".join(f"{k} {state.get(k)}" for k in ("realigned", "delay_changes"))
            result.heard.append(f"{cut}: {phantoms} in reply {reply_text(response)!r} ({counts})")
        await settle(client)
    await client.hangup(http)
    return result


async def barge_ins(
    url: str,
    http: aiohttp.ClientSession,
    echo_db: float | None,
    turns: int,
    said: tuple[np.ndarray, str],
) -> BargeIns:
    """``echo_db``: the echo's level (None: a clean line); ``said``: the
    interruption's audio and its words."""
    audio, words = said
    result = BargeIns()
    echo = None if echo_db is None else SimulatedEcho(150, echo_db)
    client = RealtimeClient(url, codec="audio/PCMU", echo=echo)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    client.send(
        {
            "type": "session.update",
            "session": {"instructions": "Tell a long story in many short sentences."},
        }
    )
    for turn in range(turns):
        playing = client.wait_for_type("output_audio_buffer.started", after=len(client.events))
        done = client.wait_for_type("response.done", after=len(client.events))
        clip = QUESTIONS[turn % len(QUESTIONS)]
        await client.mic.play(np.concatenate((librivox(clip), silence(0.3))), RATE)
        try:
            await asyncio.wait_for(playing, 40)
        except TimeoutError:
            continue
        await asyncio.sleep(1.0)
        heard = client.wait_for_type(
            "conversation.item.input_audio_transcription.completed", after=len(client.events)
        )
        mark = len(client.events)
        sent = await client.mic.play(np.concatenate((audio, silence(0.3))), RATE)
        try:
            response: dict[str, Any] = (await asyncio.wait_for(done, 30))["response"]
            transcript = (await asyncio.wait_for(heard, 30))["transcript"]
        except TimeoutError:
            result.tried += 1
            continue
        if details_reason(response) == "turn_detected":
            result.cut += 1
        elif ended_before(client, mark, sent - 0.3):
            result.ended += 1  # nothing left to cut: not counted
            continue
        result.tried += 1
        result.wer.append(word_error_rate(words, transcript))
        async with http.get(client.call_url) as status:
            echo_state = (await status.json()).get("echo_cancel") or {}
        result.heard.append(
            f"{response['status']}/{details_reason(response)}, echo detected: "
            f"{echo_state.get('echo_detected')}: {transcript}"
        )
        await settle(client)
    await client.hangup(http)
    return result


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=3, help="quiet turns per echo level")
    parser.add_argument("--barge-ins", type=int, default=3, help="real barge-ins per setting")
    parser.add_argument(
        "--short-barge-ins", type=int, default=0, help="and real barge-ins of a short 'no'"
    )
    parser.add_argument("--levels", default="-12,-6,0", help="echo levels, dB")
    parser.add_argument("--settings", default="off,on", help="--echo-cancel settings to run")
    parser.add_argument(
        "--step-ms", type=float, default=0.0, help="the echo delay's step in each quiet reply"
    )
    parser.add_argument("--calls", type=int, default=1, help="callers at once")
    parser.add_argument(
        "--server-arg", action="append", default=[], help="a voice-agent serve flag (repeat)"
    )
    args = parser.parse_args()
    levels = [float(x) for x in args.levels.split(",")]
    # The client runs below the server: its CPU is not the server's.
    os.nice(5)
    restrict_host_addresses(["127.0.0.1"])
    quiet_rows: list[list[object]] = []
    barge_rows: list[list[object]] = []
    heard_rows: list[list[object]] = []
    phantom_rows: list[list[object]] = []
    for setting in args.settings.split(","):
        server, url = await start_server(
            "--echo-cancel",
            setting,
            "--llm-max-tokens",
            "120",
            "--max-calls",
            str(args.calls),
            *args.server_arg,
        )
        try:
            async with aiohttp.ClientSession() as http:
                await wait_ready(http, url)
                for level in levels:
                    quiet = summed(
                        await asyncio.gather(
                            *(
                                quiet_turns(url, http, level, args.turns, args.step_ms)
                                for _ in range(args.calls)
                            )
                        )
                    )
                    phantom_rows += [[setting, f"{level:+.0f} dB", text] for text in quiet.heard]
                    quiet_rows.append(
                        [
                            setting,
                            f"{level:+.0f} dB",
                            quiet.replies,
                            quiet.false_barge_ins,
                            quiet.phantom_turns,
                        ]
                    )
                # Echo levels (dB); each call gets its own echo, lined up with it.
                lines: list[tuple[str, float | None]] = [("echo -6 dB", -6.0)]
                if setting == "on":
                    lines.append(("clean line", None))
                interruptions = [("long", (librivox(BARGE_IN), reference(BARGE_IN)))]
                if args.short_barge_ins:
                    interruptions.append(("'no'", (telephone_prompt("no"), "no")))
                for (kind, said), (name, gain) in itertools.product(interruptions, lines):
                    count = args.barge_ins if kind == "long" else args.short_barge_ins
                    barge = summed(
                        await asyncio.gather(
                            *(barge_ins(url, http, gain, count, said) for _ in range(args.calls))
                        )
                    )
                    wer = barge.wer
                    heard_rows += [[setting, name, kind, text] for text in barge.heard]
                    barge_rows.append(
                        [
                            setting,
                            name,
                            kind,
                            f"{barge.cut}/{barge.tried} ({barge.ended} ended first)",
                            f"{np.mean(wer):.2f}" if wer else "-",
                            " ".join(f"{w:.2f}" for w in wer),
                        ]
                    )
        finally:
            server.send_signal(signal.SIGTERM)
            await server.wait()
    sys.stdout.write(
        "Quiet caller on a speakerphone (G.711, echo 150 ms later):\n"
        + table(
            quiet_rows,
            ["echo cancel", "echo level", "replies", "false barge-ins", "phantom turns"],
        )
        + "\n\nPhantom turns heard as (reply cut or not: transcript):\n"
        + table(phantom_rows, ["echo cancel", "echo level", "heard"])
        + "\n\nReal barge-ins one second into a reply:\n"
        + table(
            barge_rows,
            ["echo cancel", "line", "interruption", "replies cut", "mean WER", "WER each"],
        )
        + f"\n\nWhat was heard (long: {reference(BARGE_IN)!r}; reply status/reason: transcript):\n"
        + table(heard_rows, ["echo cancel", "line", "interruption", "heard"])
        + "\n"
    )


if __name__ == "__main__":
    asyncio.run(main())
