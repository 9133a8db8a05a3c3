"""Word error rate of a phone call (8 kHz G.711) against a browser (Opus).

Starts ``voice-agent serve`` (its own process, the default STT and VAD; no
LLM needed: a turn's transcript comes before the reply), calls it with a
real aiortc client offering only that codec, as a SIP gateway does, speaks
each recording and reads the transcript from the data channel.

    .venv/bin/python bench/narrowband_wer.py
    .venv/bin/python bench/narrowband_wer.py --verbose      # + what each misheard clip heard
    .venv/bin/python bench/narrowband_wer.py -- --stt parakeet
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import aiohttp
import numpy as np

from voice_agent.client import RealtimeClient
from voice_agent.rtc.call import restrict_host_addresses
from voice_agent.testing.audio_data import librivox, reference, silence, word_error_rate
from voice_agent.testing.serving import start_server, wait_ready

CLIPS = ["0870", "0880", "0890", "0920", "0930"]
CODECS = ["audio/opus", "audio/PCMU", "audio/PCMA"]


async def transcribe(http: aiohttp.ClientSession, url: str, codec: str, clip: str) -> str:
    client = RealtimeClient(url, codec=codec)
    try:
        await client.connect(http)
        done = client.wait_for_type("conversation.item.input_audio_transcription.completed")
        client.mic.play(np.concatenate((librivox(clip), silence(0.6))), 16_000)
        event = await asyncio.wait_for(done, 60)
        return str(event["transcript"])
    finally:
        await client.hangup(http)


async def main(flags: list[str], verbose: bool = False) -> None:
    restrict_host_addresses(["127.0.0.1"])
    process, url = await start_server("--llm-base-url", "http://127.0.0.1:9/v1", *flags)
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url)
            rows = {
                codec: [await transcribe(http, url, codec, c) for c in CLIPS] for codec in CODECS
            }
    finally:
        process.send_signal(signal.SIGINT)
        await process.wait()
    print(f"| codec | {' | '.join(CLIPS)} | mean WER |")
    print(f"|---|{'---|' * len(CLIPS)}---|")
    for codec, texts in rows.items():
        rates = [word_error_rate(reference(c), t) for c, t in zip(CLIPS, texts, strict=True)]
        cells = " | ".join(f"{r:.2f}" for r in rates)
        print(f"| {codec.split('/')[1]} | {cells} | {sum(rates) / len(rates):.3f} |")
    if verbose:
        print()
        for codec, texts in rows.items():
            for clip, text in zip(CLIPS, texts, strict=True):
                if word_error_rate(reference(clip), text) > 0:
                    print(f"{codec.split('/')[1]} {clip}: heard {text!r}")
                    print(f"{' ' * len(codec.split('/')[1])} {clip}: said  {reference(clip)!r}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verbose", action="store_true", help="each misheard clip's words")
    parser.add_argument("flags", nargs="*", help="more voice-agent serve flags, after --")
    args = parser.parse_args()
    asyncio.run(main(args.flags, args.verbose))
