"""Talk to the voice agent from Python: one WebRTC call, a WAV file spoken
into it in real time, the agent's words printed and its reply saved.

    .venv/bin/python examples/python_client.py question.wav --url http://127.0.0.1:8080
    .venv/bin/python examples/python_client.py question.wav --token "$KEY" --out reply.wav

The client is the one the tests and benchmarks use (voice_agent.client):
an aiortc peer with the Realtime data channel. A server on this machine is
reached over loopback with --ice-host-address 127.0.0.1 (WebRTC's ICE
leaves loopback out of its candidates otherwise).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import wave
from pathlib import Path

import aiohttp
import numpy as np

from voice_agent.client import RealtimeClient
from voice_agent.rtc.call import restrict_host_addresses

REPLY_RATE = 48_000  # what the client's remote track decodes to


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """Mono 16-bit samples and their rate (the first channel of several)."""
    with wave.open(str(path), "rb") as wav:
        if wav.getsampwidth() != 2:
            raise SystemExit(f"{path}: 16-bit PCM WAV only")
        frames = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
        return frames[:: wav.getnchannels()].astype(np.int16), wav.getframerate()


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(samples.astype("<i2").tobytes())


async def talk(args: argparse.Namespace) -> int:
    samples, rate = read_wav(args.wav)
    if args.ice_host_address:
        restrict_host_addresses(args.ice_host_address)
    client = RealtimeClient(args.url, token=args.token)
    async with aiohttp.ClientSession() as http:
        await client.connect(http)
        try:
            await asyncio.wait_for(client.wait_for_type("session.created"), 10)
            done = client.wait_for_type("response.done")
            started = time.monotonic()
            # Speech, then a second of silence: the pause that ends the turn.
            await client.mic.play(np.concatenate((samples, np.zeros(rate, np.int16))), rate)
            response = (await asyncio.wait_for(done, args.timeout))["response"]
            heard = client.of_type("conversation.item.input_audio_transcription.completed")
            for event in heard:
                sys.stdout.write(f"you said:   {event['transcript']}\n")
            for item in response.get("output", []):
                for part in item.get("content", []):
                    if part.get("transcript"):
                        sys.stdout.write(f"agent said: {part['transcript']}\n")
            if args.out is not None:
                reply = [
                    c
                    for c, t in zip(client.received.chunks, client.received.arrivals, strict=True)
                    if t >= started
                ]
                write_wav(
                    args.out, np.concatenate(reply) if reply else np.zeros(0, np.int16), REPLY_RATE
                )
                sys.stdout.write(f"reply audio: {args.out}\n")
            return 0 if response["status"] == "completed" else 1
        finally:
            await client.hangup(http)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("wav", type=Path, help="16-bit PCM WAV, any rate")
    parser.add_argument("--url", default="http://127.0.0.1:8080", help="the service's base URL")
    parser.add_argument("--token", help="an API key or a client secret (ek_...)")
    parser.add_argument("--out", type=Path, help="save the reply's audio here (WAV)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the reply")
    parser.add_argument(
        "--ice-host-address", action="append", help="offer only this local address (repeatable)"
    )
    return asyncio.run(talk(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
