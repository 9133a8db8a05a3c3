"""A real HTTP peer for remote-STT tests: OpenAI's
``/v1/audio/transcriptions`` wire format (multipart WAV in, ``{"text"}``
out) around a real STT backend. It can stall every request, and it can fail
the utterances that hold a given word (answer 500, or never answer), the way
a server chokes on one input while it serves the others."""

from __future__ import annotations

import asyncio
import io
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, Literal

import aiohttp
import numpy as np
from aiohttp import web

from voice_agent.backends.base import SttBackend
from voice_agent.testing.local_http import serve_on_loopback

API_KEY = "test-key"


class TranscriptionServer:
    """POST /v1/audio/transcriptions (multipart: file, model, ...) -> {"text"}."""

    def __init__(self, stt: SttBackend) -> None:
        self.stt = stt
        self.forms: list[dict[str, Any]] = []
        self.requests = 0
        self.stall = asyncio.Event()
        self.stall.set()
        # Utterances whose transcript holds ``poison`` get ``poison_reply``.
        self.poison: str | None = None
        # "empty": a 200 with no words, as a model that heard nobody answers.
        self.poison_reply: Literal["error", "hang", "empty"] = "error"
        self.poisoned = 0  # requests answered with the fault
        self.abandoned = 0  # requests whose client hung up before the answer
        self._released = asyncio.Event()  # ends the hangs (at shutdown)
        self.app = web.Application()
        self.app.router.add_post("/v1/audio/transcriptions", self.transcribe)
        self.app.router.add_post("/broken/audio/transcriptions", self.broken)
        self.app.router.add_post("/latin1/audio/transcriptions", self.latin1)
        self.peers: list[object] = []  # each request's client address

    async def transcribe(self, request: web.Request) -> web.StreamResponse:
        try:
            return await self._transcribe(request)
        except asyncio.CancelledError:  # the client went away (handler cancellation)
            self.abandoned += 1
            raise

    async def _transcribe(self, request: web.Request) -> web.StreamResponse:
        self.requests += 1
        assert request.transport is not None
        self.peers.append(request.transport.get_extra_info("peername"))
        if request.headers.get("Authorization") != f"Bearer {API_KEY}":
            return web.json_response({"error": {"message": "invalid api key"}}, status=401)
        form: dict[str, Any] = {}
        async for part in await request.multipart():
            assert isinstance(part, aiohttp.BodyPartReader)
            form[part.name or ""] = await part.read() if part.filename else await part.text()
        self.forms.append(form)
        await self.stall.wait()
        with wave.open(io.BytesIO(form["file"])) as handle:
            if handle.getframerate() != 16000 or handle.getnchannels() != 1:
                return web.json_response({"error": {"message": "want 16 kHz mono"}}, status=400)
            audio = np.frombuffer(handle.readframes(handle.getnframes()), dtype="<i2")
        text = await self.stt.transcribe(audio.astype(np.int16))
        if self.poison is not None and self.poison in text.lower():
            self.poisoned += 1
            if self.poison_reply == "empty":
                return web.json_response({"text": ""})
            if self.poison_reply == "hang":
                await self._released.wait()
            return web.json_response(
                {"error": {"message": "CUDA error: an illegal memory access was encountered"}},
                status=500,
            )
        return web.json_response({"text": text})

    async def broken(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="<html>gateway</html>", content_type="text/html")

    async def latin1(self, request: web.Request) -> web.StreamResponse:
        """Claims UTF-8, sends Latin-1."""
        body = "Passerelle défaillante".encode("latin-1")
        return web.Response(body=body, status=502, content_type="text/plain", charset="utf-8")


@asynccontextmanager
async def transcription_server(stt: SttBackend) -> AsyncIterator[tuple[TranscriptionServer, str]]:
    """The server on a local port, and its URL."""
    server = TranscriptionServer(stt)
    async with serve_on_loopback(server.app) as url:
        try:
            yield server, url
        finally:
            server.stall.set()
            server._released.set()
