"""Coqui TTS (the ``coqui-tts`` package): XTTS-v2 voices that stream, and
VITS-style voices that synthesise a text piece at once. This module is the
backend that sessions call, its synthesis and its ``create()`` factory; the
model, its device and its voices are loaded by coqui_model.py.

One model per process, shared by every session through one priority worker
thread: one inference at a time, a reply's first piece first. An XTTS piece
is a generator (``inference_stream``) whose every chunk is one job, so the
sessions speaking at once interleave between chunks, and a barge-in closes
the generator before its next chunk.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, Self

import numpy as np

from voice_agent.backends.base import PriorityInferenceWorker
from voice_agent.backends.registry import BackendUnavailable
from voice_agent.backends.tts.coqui_model import (
    HOW_TO_PROVIDE,
    load_model,
    model_files,
    read_config,
    select_device,
    vits_voices,
    xtts_voices,
)

log = logging.getLogger(__name__)

# Tokens of XTTS's GPT per streamed chunk (Coqui's default): ~0.9 s of audio.
XTTS_CHUNK_TOKENS = 20


def _to_int16(wav: Any) -> np.ndarray:
    samples = np.asarray(wav.detach().cpu().numpy() if hasattr(wav, "detach") else wav)
    scaled: np.ndarray = np.clip(samples.reshape(-1), -1.0, 1.0) * 32767
    return scaled.astype(np.int16)


@dataclass
class _XttsStream:
    """One piece being streamed: its text, its generator, and the GPT prompt
    embedding it was started with (see _next_chunk)."""

    text: str
    chunks: Iterator[Any]
    prefix: Any = None
    made: int = 0
    finished: bool = False


@dataclass
class CoquiStats:
    pieces: int = 0
    chunks: int = 0
    streams_closed_early: int = 0
    first_chunk_ms: list[float] = field(default_factory=list)


class CoquiOptions(Protocol):
    """What ``--tts coqui`` reads: its TtsSettings fields, and from
    SttSettings the spoken language (XTTS speaks it)."""

    @property
    def tts_model(self) -> str | None: ...
    @property
    def tts_device(self) -> Literal["auto", "cpu", "cuda"]: ...
    @property
    def tts_threads(self) -> int: ...
    @property
    def tts_voice(self) -> str | None: ...
    @property
    def tts_speed(self) -> float: ...
    @property
    def stt_language(self) -> str | None: ...


class CoquiTts:
    name = "coqui"

    def __init__(
        self,
        model: str,
        device: str,
        threads: int,
        voice: str | None,
        speed: float,
        language: str | None,
    ) -> None:
        import torch

        checkpoint, config_path = model_files(model)
        config = read_config(config_path)
        device = select_device(device, threads)
        self._torch = torch
        self.device = device
        self.model_path = checkpoint
        self.streams = bool(config.get("model") == "xtts")
        started = time.perf_counter()
        self._model = load_model(config, checkpoint, config_path.parent, self.streams, device)
        self._config = config
        self._speed = speed
        self._worker = PriorityInferenceWorker("tts")
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False
        self.counters = CoquiStats()
        if self.streams:
            languages = list(config.get("languages") or ["en"])
            self._language = language if language in languages else languages[0]
            self._latents = xtts_voices(self._model, config, voice, checkpoint)
            self._voices: list[str] = list(self._latents)
            self.sample_rate = int(config.model_args.output_sample_rate)
        else:
            self._language = language
            self._voices = vits_voices(self._model, voice, checkpoint)
            audio = config.audio
            self.sample_rate = int(audio.get("output_sample_rate") or audio.sample_rate)
            if speed != 1.0 and hasattr(self._model, "length_scale"):
                self._model.length_scale = self._model.length_scale / speed
        log.info(
            "tts model loaded",
            extra={
                "backend": self.name,
                "path": str(checkpoint),
                "class": type(self._model).__name__,
                "device": device,
                "streams": self.streams,
                "voices": self._voices[:8],
                "seconds": round(time.perf_counter() - started, 2),
            },
        )

    @classmethod
    def from_settings(cls, settings: CoquiOptions) -> Self:
        """Loaded as ``--tts coqui`` asks (blocking: seconds to minutes)."""
        if not settings.tts_model:
            raise BackendUnavailable("--tts coqui needs --tts-model. " + HOW_TO_PROVIDE)
        return cls(
            settings.tts_model,
            settings.tts_device,
            settings.tts_threads,
            settings.tts_voice,
            settings.tts_speed,
            settings.stt_language,
        )

    def voices(self) -> Sequence[str]:
        return tuple(self._voices)

    def _voice(self, voice: str | None) -> str:
        if voice is None:
            return self._voices[0]
        if voice not in self._voices:
            raise ValueError(f"unknown voice {voice!r} (voices: {', '.join(self._voices)})")
        return voice

    async def stream(
        self, text: str, voice: str | None = None, urgent: bool = False
    ) -> AsyncIterator[np.ndarray]:
        speaker = self._voice(voice)
        if not any(ch.isalnum() for ch in text):
            return  # nothing to say (a stray punctuation mark)
        self.counters.pieces += 1
        if not self.streams:
            yield await self._worker.run(self._synthesize_blocking, text, speaker, urgent=urgent)
            return
        started = time.perf_counter()
        stream = _XttsStream(text, self._start_stream(text, speaker))
        try:
            while True:
                # Only the first chunk is urgent: the caller waits for it; the
                # next ones have the audio before them as slack.
                chunk = await self._worker.run(
                    self._next_chunk, stream, urgent=urgent and stream.made == 0
                )
                if chunk is None:
                    return
                if stream.made == 1:
                    self.counters.first_chunk_ms.append((time.perf_counter() - started) * 1000)
                yield chunk
        finally:
            if not stream.finished:
                self._close_later(stream)

    def _start_stream(self, text: str, speaker: str) -> Iterator[Any]:
        """The generator; it computes nothing until its first next()."""
        gpt_cond_latent, speaker_embedding = self._latents[speaker]
        config = self._config
        generator: Iterator[Any] = self._model.inference_stream(
            text,
            self._language,
            gpt_cond_latent,
            speaker_embedding,
            stream_chunk_size=XTTS_CHUNK_TOKENS,
            temperature=config.temperature,
            length_penalty=config.length_penalty,
            repetition_penalty=config.repetition_penalty,
            top_k=config.top_k,
            top_p=config.top_p,
            speed=self._speed,
        )
        return generator

    def _next_chunk(self, stream: _XttsStream) -> np.ndarray | None:
        """One chunk of one piece (in the worker thread)."""
        inference = self._model.gpt.gpt_inference
        # XTTS keeps the prompt embedding of the piece it last started on the
        # model (store_prefix_emb) and reads its length at every later token:
        # with sessions interleaving, restore this piece's before going on.
        if stream.prefix is not None:
            inference.store_prefix_emb(stream.prefix)
        try:
            wav = next(stream.chunks)
        except StopIteration:
            stream.finished = True
            return None
        if stream.prefix is None:
            stream.prefix = inference.cached_prefix_emb
        stream.made += 1
        self.counters.chunks += 1
        return _to_int16(wav)

    def _close_later(self, stream: _XttsStream) -> None:
        """Close an unfinished generator in the worker thread (where it runs),
        after the chunk it may be making now; a barge-in does not wait for it."""
        self.counters.streams_closed_early += 1
        if self._closed:
            return  # the worker is gone; so is the model with it

        async def close() -> None:
            try:
                await self._worker.run(self._close_stream, stream, urgent=True)
            except asyncio.CancelledError:
                pass  # the backend closed meanwhile
            except Exception:
                log.warning("closing an xtts stream failed", exc_info=True)

        task = asyncio.get_running_loop().create_task(close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    def _close_stream(self, stream: _XttsStream) -> None:
        close = getattr(stream.chunks, "close", None)
        if close is not None:
            close()
        stream.finished = True

    def _synthesize_blocking(self, text: str, speaker: str) -> np.ndarray:
        manager = getattr(self._model, "speaker_manager", None)
        named = manager is not None and bool(manager.speaker_names)
        with self._torch.inference_mode():
            output = self._model.synthesize(
                text, speaker=speaker if named else None, language=self._language
            )
        self.counters.chunks += 1
        return _to_int16(output["wav"])

    def stats(self) -> dict[str, object]:
        firsts = sorted(self.counters.first_chunk_ms)
        return {
            "backend": self.name,
            "device": self.device,
            "streams": self.streams,
            "pieces": self.counters.pieces,
            "chunks": self.counters.chunks,
            "streams_closed_early": self.counters.streams_closed_early,
            "first_chunk_ms_p50": round(firsts[len(firsts) // 2], 1) if firsts else None,
        }

    def close(self) -> None:
        self._closed = True
        self._worker.close()


def create(settings: CoquiOptions) -> CoquiTts:
    return CoquiTts.from_settings(settings)
