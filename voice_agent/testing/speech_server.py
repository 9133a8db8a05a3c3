"""A real HTTP peer for remote-TTS tests: OpenAI's ``/v1/audio/speech``
wire format (JSON in, raw PCM16 at 24 kHz streamed out with chunked
transfer, no rate header, as OpenAI sends ``response_format: "pcm"``)
around a real TTS backend (Piper). The PCM goes out in 50 ms writes as a
streaming server sends it, and it can hold the rest of a piece after its
first write. It can fail the pieces that hold a given word, the way a
server chokes on one input while it serves the others: answer 500, never
answer, send some audio and then cut the connection, or send some audio and
then go quiet.

Run on its own (``python -m voice_agent.testing.speech_server --port N``) it serves the
packaged Piper voice to another process (bench/tts.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import numpy as np
from aiohttp import web

from voice_agent.audio.resample import StreamResampler
from voice_agent.backends.base import TtsBackend
from voice_agent.testing.local_http import serve_on_loopback

API_KEY = "test-key"
OPENAI_PCM_RATE = 24_000
WRITE_SAMPLES = OPENAI_PCM_RATE // 20  # 50 ms a write
Fault = Literal["error", "hang", "break", "stall"]


class SpeechServer:
    """POST /v1/audio/speech {model, input, voice, response_format: "pcm"} -> PCM16."""

    def __init__(self, tts: TtsBackend, api_key: str | None = API_KEY) -> None:
        self.tts = tts
        self.api_key = api_key
        self.bodies: list[dict[str, Any]] = []
        self.sent: list[int] = []  # samples of each piece answered in full
        self.in_flight = 0
        self.most_in_flight = 0  # requests being answered at once, at most
        self.stall = asyncio.Event()  # cleared: every request waits before answering
        self.stall.set()
        # Cleared: each piece's first ``held_after`` samples go out, the rest waits for it.
        self.rest = asyncio.Event()
        self.rest.set()
        self.held_after = WRITE_SAMPLES
        # Pieces whose text holds ``poison`` get ``fault``.
        self.poison: str | None = None
        self.fault: Fault = "error"
        self.poisoned = 0  # requests answered with the fault
        self.abandoned = 0  # requests whose client hung up before the end
        self._abandon_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._released = asyncio.Event()  # ends the hangs (at shutdown)
        self.app = web.Application()
        self.app.router.add_post("/v1/audio/speech", self.speech)

    async def speech(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await self._speech(request)
        except asyncio.CancelledError:  # the client went away (handler cancellation)
            self.abandoned += 1
            for count, future in self._abandon_waiters:
                if self.abandoned >= count and not future.done():
                    future.set_result(None)
            raise
        finally:
            self.in_flight -= 1

    def wait_abandoned(self, count: int) -> asyncio.Future[None]:
        """Resolves once ``count`` requests in all were hung up on."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.abandoned >= count:
            future.set_result(None)
        else:
            self._abandon_waiters.append((count, future))
        return future

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        body = json.loads(await request.read())
        self.bodies.append(body)
        text, voice = body.get("input"), body.get("voice")
        if body.get("response_format") != "pcm":
            return web.json_response({"error": {"message": "this server sends pcm"}}, status=400)
        if voice not in self.tts.voices():
            message = f"voice {voice!r} is not one of {', '.join(self.tts.voices())}"
            return web.json_response({"error": {"message": message}}, status=400)
        await self.stall.wait()
        poisoned = self.poison is not None and self.poison in text
        if poisoned:
            self.poisoned += 1
            if self.fault == "error":
                return web.json_response(
                    {"error": {"message": "CUDA error: device-side assert triggered"}}, status=500
                )
            if self.fault == "hang":
                await self._released.wait()
        pcm = await self._pcm(text, voice)
        response = web.StreamResponse(headers={"Content-Type": "audio/pcm"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        for start in range(0, len(pcm), WRITE_SAMPLES):
            if start == WRITE_SAMPLES:  # after the first write
                if poisoned and self.fault == "break":
                    # The first write is read before the reset, which would
                    # discard it were it still unread.
                    await asyncio.sleep(0.05)
                    assert request.transport is not None
                    request.transport.abort()
                    return response
                if poisoned and self.fault == "stall":
                    await self._released.wait()
            if start == self.held_after:
                await self.rest.wait()
            await response.write(pcm[start : start + WRITE_SAMPLES].astype("<i2").tobytes())
        await response.write_eof()
        self.sent.append(len(pcm))
        return response

    async def _pcm(self, text: str, voice: str) -> np.ndarray:
        """The whole piece at OpenAI's rate (Piper makes a clause at once)."""
        resampler = StreamResampler(self.tts.sample_rate, OPENAI_PCM_RATE)
        parts = [resampler.process(chunk) async for chunk in self.tts.stream(text, voice)]
        parts.append(resampler.process(np.zeros(0, np.int16), last=True))
        return np.concatenate(parts)


@asynccontextmanager
async def speech_server(
    tts: TtsBackend, api_key: str | None = API_KEY
) -> AsyncIterator[tuple[SpeechServer, str]]:
    """The server on a local port, and its base URL (``.../v1``)."""
    server = SpeechServer(tts, api_key)
    async with serve_on_loopback(server.app) as url:
        try:
            yield server, f"{url}/v1"
        finally:
            server.stall.set()
            server.rest.set()
            server._released.set()


def main() -> None:
    """Serve the packaged Piper voice (``joe``) until killed."""
    from voice_agent.backends.tts.piper_tts import PiperTts, voice_paths

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    tts = PiperTts(voice_paths(None), 1.0, args.threads)
    server = SpeechServer(tts, api_key=None)
    runner = web.AppRunner(server.app, access_log=None, handler_cancellation=True)

    async def serve() -> None:
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", args.port).start()
        print("listening", flush=True)  # noqa: T201 - the parent waits for this line
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
