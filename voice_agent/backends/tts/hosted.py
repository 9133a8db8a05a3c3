"""Remote text-to-speech over the OpenAI wire format.

``POST {base_url}/audio/speech`` with ``response_format: "pcm"``: raw mono
PCM16 back (24 kHz from OpenAI; the rate an ``X-Sample-Rate`` header names,
when the server sends one). Served by OpenAI, Kokoro-FastAPI, vLLM-Omni and
by this service's own model process (``--workers``), which also takes
``priority: "urgent"`` for a reply's first piece. One pooled keep-alive
session for every piece; cancelling a caller closes its connection, which
ends the server's work on it.

The voices are names the server knows (``--tts-remote-voices``; the
server is not asked, as OpenAI's has no list). ``--tts-timeout-s`` bounds
the wait for the first audio and every gap in the stream after it, not the
whole piece: a streaming server may take longer than that to say a long
sentence, as long as it keeps talking.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence

import aiohttp
import numpy as np

from voice_agent.backends.base import BackendError
from voice_agent.backends.registry import BackendUnavailable
from voice_agent.backends.runtime.http_pool import PooledHttpClient
from voice_agent.config.tts import TtsSettings

OPENAI_PCM_RATE = 24_000
DEFAULT_MODEL = "tts-1"
DEFAULT_VOICE = "alloy"


class RemoteTtsError(BackendError):
    """The TTS server could not be reached or did not give audio."""


class OpenAITts(PooledHttpClient):
    name = "openai"

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str,
        voices: Sequence[str],
        timeout_s: float,
        sample_rate: int = OPENAI_PCM_RATE,
        unix_socket: str | None = None,
        send_priority: bool = False,
    ) -> None:
        super().__init__(base_url.rstrip("/") + "/audio/speech", timeout_s, unix_socket)
        if not voices:
            raise BackendUnavailable("the remote TTS needs at least one voice name")
        self._timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=timeout_s, sock_read=timeout_s
        )
        self._timeout_s = timeout_s
        self.sample_rate = sample_rate
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._model = model
        self._voices = tuple(voices)
        self._send_priority = send_priority

    def _closed_error(self) -> Exception:
        return RemoteTtsError(
            f"the TTS client for {self.url} is closed", "the TTS client is closed"
        )

    def voices(self) -> Sequence[str]:
        return self._voices

    async def stream(
        self, text: str, voice: str | None = None, urgent: bool = False
    ) -> AsyncIterator[np.ndarray]:
        """PCM as the server sends it: each chunk of the body, whole samples only."""
        body: dict[str, object] = {
            "model": self._model,
            "input": text,
            "voice": voice or self._voices[0],
            "response_format": "pcm",
        }
        if self._send_priority:
            body["sample_rate"] = self.sample_rate
            if urgent:
                body["priority"] = "urgent"
        loop = asyncio.get_running_loop()
        started = loop.time()
        carry = b""
        sent = 0  # samples yielded: a failure after some is a broken stream
        try:
            async with self._session().post(self.url, json=body, headers=self._headers) as response:
                if response.status != 200:
                    detail = (await response.read())[:300].decode("utf-8", errors="replace")
                    raise RemoteTtsError(
                        f"TTS server {self.url} answered {response.status}: {detail}",
                        f"the TTS server answered {response.status}",
                    )
                rate = response.headers.get("X-Sample-Rate")
                if rate is not None and rate != str(self.sample_rate):
                    raise RemoteTtsError(
                        f"TTS server {self.url} sent {rate} Hz, not {self.sample_rate}",
                        f"the TTS server sent {rate} Hz, not {self.sample_rate}",
                    )
                async for data in response.content.iter_any():
                    data = carry + data
                    whole = len(data) - len(data) % 2
                    carry = data[whole:]
                    if not whole:
                        continue
                    if not sent:
                        self._latency.add(loop.time() - started)
                    sent += whole // 2
                    yield np.frombuffer(data[:whole], dtype="<i2").astype(np.int16)
        except TimeoutError:  # before ClientError: aiohttp's read timeout is both
            self._errors += 1
            if sent:
                heard_ms = 1000 * sent / self.sample_rate
                said = f"sent no more audio for {self._timeout_s:g} s after {heard_ms:.0f} ms of it"
                raise RemoteTtsError(
                    f"TTS server {self.url} {said}", f"the TTS server {said}"
                ) from None
            said = f"gave no audio within {self._timeout_s:g} s"
            raise RemoteTtsError(
                f"TTS server {self.url} {said}", f"the TTS server {said}"
            ) from None
        except aiohttp.ClientError as exc:
            self._errors += 1
            if sent:
                said = f"broke off the audio after {1000 * sent / self.sample_rate:.0f} ms"
                raise RemoteTtsError(
                    f"TTS server {self.url} {said}: {exc}", f"the TTS server {said}"
                ) from exc
            raise RemoteTtsError(
                f"cannot reach TTS server {self.url}: {exc}", "the TTS server could not be reached"
            ) from exc
        except RemoteTtsError:
            self._errors += 1
            raise


def remote_voices(settings: TtsSettings) -> list[str]:
    """The voice names to offer, the default first: ``--tts-remote-voices``,
    led by ``--tts-remote-voice`` when that is given too."""
    voices = [v for v in settings.tts_remote_voices if v]
    default = settings.tts_remote_voice or (voices[0] if voices else DEFAULT_VOICE)
    return [default, *(v for v in voices if v != default)]


def create(settings: TtsSettings) -> OpenAITts:
    if not settings.tts_base_url:
        raise BackendUnavailable(
            "--tts openai needs --tts-base-url (e.g. https://api.openai.com/v1, or a "
            "Kokoro-FastAPI or vLLM server's /v1)"
        )
    return OpenAITts(
        settings.tts_base_url,
        settings.tts_api_key or os.environ.get("OPENAI_API_KEY"),
        settings.tts_model or DEFAULT_MODEL,
        remote_voices(settings),
        settings.tts_timeout_s,
        settings.tts_sample_rate,
    )


def hosted(
    unix_socket: str, sample_rate: int, timeout_s: float, voices: Sequence[str]
) -> OpenAITts:
    """A client of this service's own model process (``--workers``), which
    speaks with ``voices`` (the model's own)."""
    return OpenAITts(
        "http://models/v1",
        None,
        "default",
        voices,
        timeout_s,
        sample_rate=sample_rate,
        unix_socket=unix_socket,
        send_priority=True,
    )
