"""Remote speech-to-text over the OpenAI wire format.

``POST {base_url}/audio/transcriptions`` with a multipart WAV upload, as
served by OpenAI, vLLM, NVIDIA NIM and others, so STT can run on separate
GPU machines. The server batches across requests itself; here every
utterance is one request, over one pooled keep-alive session (a new
connection per utterance would add DNS, TCP and TLS set-up, 50-300 ms, to
every final).
"""

from __future__ import annotations

import io
import json
import logging
import os
import time
import wave
from typing import Any

import aiohttp
import numpy as np

from voice_agent.backends.base import BackendError
from voice_agent.backends.capabilities import Transcription
from voice_agent.backends.registry import BackendUnavailable
from voice_agent.backends.runtime.http_pool import PooledHttpClient
from voice_agent.config.stt import SttSettings

log = logging.getLogger(__name__)

DEFAULT_MODEL = "whisper-1"
SAMPLE_RATE = 16_000


class RemoteSttError(BackendError):
    """The STT server could not be reached or did not give a transcript."""


def wav_bytes(audio: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(SAMPLE_RATE)
        handle.writeframes(audio.astype("<i2", copy=False).tobytes())
    return buffer.getvalue()


class OpenAIStt(PooledHttpClient):
    name = "openai"

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str,
        language: str | None,
        timeout_s: float,
        unix_socket: str | None = None,
    ) -> None:
        super().__init__(base_url.rstrip("/") + "/audio/transcriptions", timeout_s, unix_socket)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._model = model
        self._language = language

    def _closed_error(self) -> Exception:
        return RemoteSttError(
            f"the STT client for {self.url} is closed", "the STT client is closed"
        )

    async def transcribe(self, audio: np.ndarray) -> str:
        answer = await self._request(audio, None)
        if answer is None:  # only low-priority requests are ever shed
            raise RemoteSttError(
                f"STT server {self.url} shed a final transcript",
                "the STT server shed a final transcript",
            )
        return str(answer["text"])

    async def _request(
        self, audio: np.ndarray, priority: str | None, fields: dict[str, str] | None = None
    ) -> dict[str, Any] | None:
        """The server's answer (its "text" a stripped string), or None when
        it shed a low-priority request."""
        form = aiohttp.FormData()
        form.add_field("file", wav_bytes(audio), filename="audio.wav", content_type="audio/wav")
        form.add_field("model", self._model)
        form.add_field("response_format", "json")
        if self._language:
            form.add_field("language", self._language)
        if priority is not None:
            form.add_field("priority", priority)
        for name, value in (fields or {}).items():
            form.add_field(name, value)
        started = time.monotonic()
        try:
            # A cancelled caller closes its connection; the others stay pooled.
            async with self._session().post(self.url, data=form, headers=self._headers) as response:
                # Bytes, not text(): a body that isn't UTF-8 is still quoted.
                body = (await response.read()).decode("utf-8", errors="replace")
                if response.status != 200:
                    raise RemoteSttError(
                        f"STT server {self.url} answered {response.status}: {body[:300]}",
                        f"the STT server answered {response.status}",
                    )
        except aiohttp.ClientError as exc:
            self._errors += 1
            raise RemoteSttError(
                f"cannot reach STT server {self.url}: {exc}", "the STT server could not be reached"
            ) from exc
        except TimeoutError:
            self._errors += 1
            raise RemoteSttError(
                f"STT server {self.url} gave no answer within {self._timeout.total} s",
                f"the STT server gave no answer within {self._timeout.total} s",
            ) from None
        except RemoteSttError:
            self._errors += 1
            raise
        try:
            answer = json.loads(body)
            text = answer["text"]
            if text is None and answer.get("shed") is True and priority is not None:
                return None
            if not isinstance(text, str):
                raise TypeError(type(text).__name__)
        except (ValueError, KeyError, TypeError) as exc:
            self._errors += 1
            raise RemoteSttError(
                f"STT server {self.url} sent no transcript ({exc!r}): {body[:300]}",
                "the STT server sent no transcript",
            ) from None
        self._latency.add(time.monotonic() - started)
        answer["text"] = text.strip()
        return dict(answer)


class HostedStt(OpenAIStt):
    """This service's own model process (``--workers``): it schedules by
    priority, so speculative and partial work is sent as such and shed there
    while finals wait, exactly as with a model in this process."""

    name = "hosted"

    def __init__(self, unix_socket: str, partial_interval_ms: int, timeout_s: float) -> None:
        super().__init__("http://models/v1", None, "default", None, timeout_s, unix_socket)
        self.default_partial_interval_ms = partial_interval_ms

    async def transcribe_speculative(self, audio: np.ndarray) -> str | None:
        answer = await self._request(audio, "speculative")
        return None if answer is None else str(answer["text"])

    async def transcribe_partial(self, audio: np.ndarray) -> str | None:
        answer = await self._request(audio, "partial")
        return None if answer is None else str(answer["text"])

    async def transcribe_detailed(
        self, audio: np.ndarray, *, careful: bool = False, speculative: bool = False
    ) -> Transcription | None:
        """The model process's transcript with its evidence; ``careful`` is
        decoded the safe way there (a model with no safer way says so)."""
        fields = {"detail": "true", **({"careful": "true"} if careful else {})}
        answer = await self._request(audio, "speculative" if speculative else None, fields)
        if answer is None:
            return None
        return Transcription(
            str(answer["text"]),
            no_speech_prob=_number(answer.get("no_speech_prob")),
            avg_logprob=_number(answer.get("avg_logprob")),
            truncated=answer.get("truncated") is True,
            careful=answer.get("careful") is not False,
        )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def create(settings: SttSettings) -> OpenAIStt:
    if not settings.stt_base_url:
        raise BackendUnavailable(
            "--stt openai needs --stt-base-url (e.g. http://gpu-host:8000/v1 for vLLM, "
            "https://api.openai.com/v1 for OpenAI)"
        )
    model = settings.stt_model if "stt_model" in settings.model_fields_set else DEFAULT_MODEL
    # The variable OpenAI's own clients read, as for the LLM key.
    api_key = settings.stt_api_key or os.environ.get("OPENAI_API_KEY")
    return OpenAIStt(
        settings.stt_base_url,
        api_key,
        model,
        settings.stt_language,
        settings.stt_timeout_s,
    )
