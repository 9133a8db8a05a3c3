"""A caller in a process of its own, for the test to kill (SIGKILL) while
the assistant is speaking to it: a peer that vanishes without a goodbye (no
DELETE, no DTLS close, no SCTP abort; its sockets just go away).

    python tests/vanishing_peer.py URL "what to ask"

It connects over loopback, types its question, asks for a reply and prints
the call's location, then ``speaking`` once the reply's audio has started;
then it keeps the call up until it is killed.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from voice_agent.client import RealtimeClient
from voice_agent.rtc.call import restrict_host_addresses


async def main(url: str, question: str) -> None:
    restrict_host_addresses(["127.0.0.1"])  # as the tests' server: loopback only
    async with aiohttp.ClientSession() as http:
        client = RealtimeClient(url)
        await client.connect(http)
        await asyncio.wait_for(client.wait_for_type("session.created"), 10)
        sys.stdout.write(f"{client.location}\n")
        sys.stdout.flush()
        started = client.wait_for_type("output_audio_buffer.started")
        client.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": question}],
                },
            }
        )
        client.send({"type": "response.create"})
        await asyncio.wait_for(started, 30)
        sys.stdout.write("speaking\n")
        sys.stdout.flush()
        await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
