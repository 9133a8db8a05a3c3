"""How soon a real interruption stops the agent over the WebSocket
(``GET /v1/realtime``), as bench/turn_taking.py measures it over WebRTC.

Starts ``voice-agent serve`` (embedded models) in its own process and
talks to it as a phone gateway would over a WebSocket: audio goes up in
real time, 20 ms ``input_audio_buffer.append`` events on a steady clock
(silence when the caller says nothing), and the agent's audio comes down
as ``response.output_audio.delta`` events, which the server paces in real
time. Each round, a call of its own, asks for a long reply, and 0.5 s
after its first audio speaks a whole prompt of the measurement set over it
(bench/speech_sets.py, never a test's). Counted, from the client's clock:
the time from the onset of the caller's speech (its first sample sent) to
the last delta with sound (peak over 500) before 100 ms without one; and
interruptions that did not stop the reply. Rounds whose reply had ended,
or ran out within 150 ms of the onset, are left out (the model's reply to
"count to thirty" is sometimes short). The client runs at nice 10.

    .venv/bin/python bench/ws_interrupt.py --rounds 10
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import signal
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from voice_agent.audio.resample import StreamResampler
from voice_agent.testing.audio_data import speech_bounds
from voice_agent.testing.figures import percentile, table
from voice_agent.testing.serving import start_server, wait_ready

# ``python bench/<script>.py`` puts bench/ on the path, not the checkout's
# root, which the bench.* imports below are found from.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.reply_probes import SOUNDING_PEAK, last_sound, long_reply_request
from bench.turn_material import material

RATE = 16_000
WIRE_RATE = 24_000
FRAME_S = 0.02
FRAME = int(WIRE_RATE * FRAME_S)
CLIENT_NICE = 10


class WsCaller:
    """One WebSocket call: a reader keeping every event with its arrival
    time, and a microphone sending 20 ms of audio every 20 ms."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.verbose = False  # print each round's events
        self.events: list[tuple[float, dict[str, Any]]] = []
        self.sound: list[tuple[float, int]] = []  # (arrival, peak) of each delta
        # Frames to send, each with the future its sending resolves (the first of a say()).
        self._queued: deque[tuple[np.ndarray, asyncio.Future[float] | None]] = deque()
        self._control: deque[dict[str, Any]] = deque()
        self._arrived = asyncio.Event()  # set at each event, cleared by its waiters
        self._tasks = [asyncio.create_task(self._read()), asyncio.create_task(self._speak())]

    async def _read(self) -> None:
        async for message in self.ws:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            event = message.json()
            at = time.monotonic()
            self.events.append((at, event))
            self._arrived.set()
            if event["type"] == "response.output_audio.delta":
                pcm = np.frombuffer(base64.b64decode(event["delta"]), dtype="<i2")
                self.sound.append((at, int(np.abs(pcm).max()) if pcm.size else 0))

    async def _speak(self) -> None:
        silence = np.zeros(FRAME, dtype=np.int16)
        start = time.monotonic()
        sent = 0
        while True:
            while self._control:
                await self.ws.send_json(self._control.popleft())
            frame, first = self._queued.popleft() if self._queued else (silence, None)
            audio = base64.b64encode(frame.astype("<i2").tobytes()).decode()
            await self.ws.send_json({"type": "input_audio_buffer.append", "audio": audio})
            if first is not None:
                first.set_result(time.monotonic())
            sent += 1
            # A steady clock: each frame leaves when its 20 ms begins.
            await asyncio.sleep(max(0.0, start + sent * FRAME_S - time.monotonic()))

    async def say(self, samples_16k: np.ndarray) -> float:
        """Queue ``samples_16k``; returns when its first frame was sent."""
        wire = StreamResampler(RATE, WIRE_RATE).process(samples_16k, last=True)
        padded = np.concatenate((wire, np.zeros(-len(wire) % FRAME, dtype=np.int16)))
        first_sent: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        frames = padded.reshape(-1, FRAME)
        self._queued.append((frames[0], first_sent))
        self._queued.extend((frame, None) for frame in frames[1:])
        return await first_sent

    def send(self, event: dict[str, Any]) -> None:
        """Sent before the next audio frame: one writer for the socket."""
        self._control.append(event)

    async def wait_for(self, kind: str, after: int) -> dict[str, Any]:
        """The first event of ``kind`` from index ``after`` on."""
        while True:
            for _, event in self.events[after:]:
                if event["type"] == kind:
                    return event
            after = len(self.events)
            self._arrived.clear()
            await self._arrived.wait()

    def last_sound_after(self, onset: float) -> float | None:
        """When the reply sounding at ``onset`` last sounded (deltas from
        100 ms before it on: one may be sent just before the onset)."""
        return last_sound(self.sound, onset, lead_s=0.1)

    def ended_itself(self, first_event: int, before: float) -> bool:
        """Whether the reply's audio ran out of itself (``stopped``, not
        ``cleared``) before ``before``: not an interruption's doing."""
        for at, event in self.events[first_event:]:
            if event["type"] == "output_audio_buffer.cleared":
                return False
            if event["type"] == "output_audio_buffer.stopped":
                return at < before
        return False

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.ws.close()


async def interrupt_once(caller: WsCaller, prompt: np.ndarray) -> float | str:
    """A long reply, the prompt spoken over it: onset to the reply's last
    sound (ms); "not stopped" if it sounded on through the caller's speech,
    "no reply" if none was sounding when the caller began."""
    mark = len(caller.events)
    for event in long_reply_request():
        caller.send(event)
    await asyncio.wait_for(caller.wait_for("response.output_audio.delta", mark), 30)
    await asyncio.sleep(0.5)
    onset = await caller.say(prompt) + speech_bounds(prompt)[0]
    await asyncio.wait_for(caller.wait_for("response.done", mark), 60)
    await asyncio.sleep(len(prompt) / RATE + 1.0)
    last = caller.last_sound_after(onset) or onset
    caller.send({"type": "response.cancel"})
    await asyncio.sleep(1.0)
    if caller.verbose:
        for at, event in caller.events[mark:]:
            if event["type"] != "response.output_audio.delta":
                detail = event.get("response", {}).get("status_details") or event.get("error") or ""
                sys.stdout.write(f"  {at - onset:+.2f} s {event['type']} {detail}\n")
        sounds = [f"{at - onset:+.2f}:{peak}" for at, peak in caller.sound if at > onset - 0.2]
        sys.stdout.write("  sound " + " ".join(sounds[:40]) + "\n")
    sounding = any(peak > SOUNDING_PEAK for at, peak in caller.sound if onset - 0.3 <= at < onset)
    if not sounding or caller.ended_itself(mark, onset + 0.15):
        return "no reply"  # it had ended, or was ending, before the caller spoke
    if last - onset > len(prompt) / RATE:
        return "not stopped"
    return max(0.0, last - onset) * 1000


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--server-arg", action="append", default=[], help="serve flag")
    parser.add_argument("--verbose", action="store_true", help="each round's events")
    args = parser.parse_args()
    _, prompts = material(0, args.rounds)
    server, url = await start_server("--llm-max-tokens", "200", *args.server_arg)
    stops: list[float] = []
    not_stopped = no_reply = 0
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url)
            os.nice(CLIENT_NICE)  # the server started at ours; the client runs below it
            ws_url = url.replace("http://", "ws://") + "/v1/realtime?model=default"
            for number in range(args.rounds):
                # A call a round: the history of earlier rounds shortens the replies.
                ws = await http.ws_connect(ws_url, protocols=("realtime",))
                caller = WsCaller(ws)
                caller.verbose = args.verbose
                await asyncio.wait_for(caller.wait_for("session.created", 0), 10)
                stop = await interrupt_once(caller, prompts[number % len(prompts)])
                await caller.close()
                if stop == "not stopped":
                    not_stopped += 1
                elif stop == "no reply":
                    no_reply += 1
                else:
                    assert isinstance(stop, float)
                    stops.append(stop)
                shown = stop if isinstance(stop, str) else f"{stop:.0f} ms"
                sys.stdout.write(f"round {number + 1}: {shown}\n")
                sys.stdout.flush()
    finally:
        server.send_signal(signal.SIGTERM)
        await server.wait()
    rows: list[list[object]] = [
        [
            len(stops) + not_stopped,
            not_stopped,
            no_reply,
            f"{percentile(stops, 50):.0f}" if stops else "-",
            f"{max(stops):.0f}" if stops else "-",
        ]
    ]
    sys.stdout.write(
        "Interruptions over the WebSocket: onset to the reply's last sound\n"
        + table(rows, ["interruptions", "not stopped", "no reply sounding", "p50 ms", "max ms"])
        + "\n"
    )


if __name__ == "__main__":
    asyncio.run(main())
