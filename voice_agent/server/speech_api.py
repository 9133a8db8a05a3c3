"""This process's STT and TTS models served in OpenAI's audio wire format.

``POST /v1/audio/transcriptions`` (multipart WAV upload, JSON answer) and
``POST /v1/audio/speech`` (JSON request, raw PCM16 answer). With
``--workers N`` the parent process holds the models and serves them here on
a private Unix socket; the media workers are ordinary remote clients
(``backends/stt/hosted.py``, ``backends/tts/hosted.py``). So one model, and
its batching worker, serves every call of every worker, and a worker holds no
model weights.

Two fields beyond OpenAI's shape carry what a shared model needs to
schedule well; a client that does not send them gets OpenAI's behaviour:

- ``priority`` on a transcription: ``final`` (default), ``speculative`` (the
  turn so far at a pause) or ``partial`` (speech in progress). Low-priority
  work is shed while finals wait, answered ``{"text": null, "shed": true}``.
- ``priority: "urgent"`` on speech: a reply's first piece, which goes before
  other replies' later pieces. ``sample_rate`` asks for PCM at that rate
  (default 24000, OpenAI's); the answer names it in ``X-Sample-Rate``.

A client that goes away cancels its handler (the server runs with
``handler_cancellation``), which removes its request from the model's queue.
"""

from __future__ import annotations

import io
import json
import logging
import wave
from typing import Any

import numpy as np
from aiohttp import BodyPartReader, web

from voice_agent.audio.resample import StreamResampler
from voice_agent.backends.base import SttBackend, TtsBackend
from voice_agent.backends.capabilities import (
    CarefulTranscriber,
    PartialTranscriber,
    ReportsStats,
    SpeculativeTranscriber,
)
from voice_agent.server.errors import error_response

log = logging.getLogger(__name__)

STT_RATE = 16_000
OPENAI_PCM_RATE = 24_000
MAX_AUDIO_BYTES = 30 * 1024 * 1024  # ~15 minutes of 16 kHz PCM16
MAX_SPEECH_CHARS = 4096  # OpenAI's own limit on `input`
PRIORITIES = ("final", "speculative", "partial")


class SpeechRequestError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def decode_wav(data: bytes) -> np.ndarray:
    """16 kHz mono int16 samples from a PCM16 WAV file of any rate and channel count."""
    try:
        with wave.open(io.BytesIO(data), "rb") as handle:
            if handle.getsampwidth() != 2:
                raise SpeechRequestError(400, "unsupported_audio", "send 16-bit PCM WAV audio")
            channels, rate = handle.getnchannels(), handle.getframerate()
            frames = handle.readframes(handle.getnframes())
    except (wave.Error, EOFError) as exc:
        raise SpeechRequestError(400, "invalid_audio", f"not a WAV file: {exc}") from None
    samples = np.frombuffer(frames, dtype="<i2")
    if channels > 1:
        samples = samples[: len(samples) - len(samples) % channels].reshape(-1, channels)
        samples = samples.mean(axis=1).astype(np.int16)
    if rate != STT_RATE:
        samples = StreamResampler(rate, STT_RATE).process(samples, last=True)
    return np.asarray(samples, dtype=np.int16)


async def _read_transcription_form(request: web.Request) -> tuple[bytes, str, set[str]]:
    """The audio, the priority, and the flags set to "true" (``detail``:
    answer with the model's evidence; ``careful``: decode the safe way)."""
    if request.content_type != "multipart/form-data":
        raise SpeechRequestError(415, "unsupported_media_type", "send multipart/form-data")
    audio: bytes | None = None
    priority = "final"
    flags: set[str] = set()
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise SpeechRequestError(400, "invalid_body", "nested multipart")
            data = await part.read()
            if part.name == "file":
                audio = bytes(data)
            elif part.name == "priority":
                priority = data.decode("utf-8", errors="replace")
            elif part.name in ("detail", "careful") and data == b"true":
                flags.add(part.name)
    except (ValueError, AssertionError, EOFError) as exc:
        raise SpeechRequestError(400, "invalid_body", f"malformed multipart: {exc}") from None
    if audio is None:
        raise SpeechRequestError(400, "missing_file", "no 'file' part")
    if priority not in PRIORITIES:
        raise SpeechRequestError(
            400, "invalid_priority", f"priority must be one of {', '.join(PRIORITIES)}"
        )
    return audio, priority, flags


async def _detailed(stt: SttBackend, audio: np.ndarray, priority: str, careful: bool) -> Any:
    """The transcript and the model's evidence; a model with no safe way
    marks every transcript careful (there is none safer to ask for)."""
    speculative = priority == "speculative"
    if isinstance(stt, CarefulTranscriber):
        result = await stt.transcribe_detailed(audio, careful=careful, speculative=speculative)
        if result is None:
            return {"text": None, "shed": True}
        return {
            "text": result.text,
            "no_speech_prob": result.no_speech_prob,
            "avg_logprob": result.avg_logprob,
            "truncated": result.truncated,
            "careful": result.careful,
        }
    if speculative and isinstance(stt, SpeculativeTranscriber):
        text = await stt.transcribe_speculative(audio)
    else:
        text = await stt.transcribe(audio)
    return {"text": None, "shed": True} if text is None else {"text": text, "careful": True}


def add_speech_routes(app: web.Application, stt: SttBackend, tts: TtsBackend) -> None:
    async def transcriptions(request: web.Request) -> web.StreamResponse:
        try:
            data, priority, flags = await _read_transcription_form(request)
            audio = decode_wav(data)
        except SpeechRequestError as exc:
            return error_response(exc.status, exc.code, str(exc))
        if "detail" in flags and priority in ("final", "speculative"):
            return web.json_response(await _detailed(stt, audio, priority, "careful" in flags))
        text: str | None
        if priority == "speculative" and isinstance(stt, SpeculativeTranscriber):
            text = await stt.transcribe_speculative(audio)
        elif priority == "partial":
            if not isinstance(stt, PartialTranscriber):
                return error_response(400, "unsupported", f"the {stt.name} model has no partials")
            text = await stt.transcribe_partial(audio)
        else:
            text = await stt.transcribe(audio)
        if text is None:
            return web.json_response({"text": None, "shed": True})
        return web.json_response({"text": text})

    async def speech(request: web.Request) -> web.StreamResponse:
        try:
            body: Any = json.loads(await request.read())
        except (ValueError, RecursionError):
            return error_response(400, "invalid_json", "the body is not JSON")
        text = body.get("input") if isinstance(body, dict) else None
        if not isinstance(text, str) or not text.strip():
            return error_response(400, "missing_input", "'input' must be a non-empty string")
        if len(text) > MAX_SPEECH_CHARS:
            return error_response(
                400, "input_too_long", f"'input' is over {MAX_SPEECH_CHARS} characters"
            )
        if body.get("response_format", "pcm") != "pcm":
            return error_response(400, "unsupported_format", "only response_format 'pcm' is served")
        rate = body.get("sample_rate", OPENAI_PCM_RATE)
        if not isinstance(rate, int) or not 8000 <= rate <= 48000:
            return error_response(400, "invalid_sample_rate", "sample_rate must be 8000-48000")
        voice = body.get("voice")
        if voice in (None, "default"):
            voice = None
        elif voice not in tts.voices():
            return error_response(
                400, "unknown_voice", f"no voice {voice!r}: {', '.join(tts.voices())}"
            )
        resampler = StreamResampler(tts.sample_rate, rate) if rate != tts.sample_rate else None
        response = web.StreamResponse(
            headers={"Content-Type": "audio/pcm", "X-Sample-Rate": str(rate)}
        )
        chunks = tts.stream(text, voice, urgent=body.get("priority") == "urgent")
        try:
            async for chunk in chunks:
                if resampler is not None:
                    chunk = resampler.process(chunk)
                if not response.prepared:
                    await response.prepare(request)
                await response.write(np.asarray(chunk, dtype="<i2").tobytes())
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        if not response.prepared:
            await response.prepare(request)
        if resampler is not None:
            await response.write(
                np.asarray(resampler.process(np.zeros(0, np.int16), last=True), "<i2").tobytes()
            )
        await response.write_eof()
        return response

    async def speech_stats(request: web.Request) -> web.StreamResponse:
        body = dict(stt.stats()) if isinstance(stt, ReportsStats) else {}
        return web.json_response({"stt": body})

    app.router.add_post("/v1/audio/transcriptions", transcriptions)
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_get("/v1/audio/stats", speech_stats)
