"""Coqui TTS (the ``coqui-tts`` package): XTTS-v2 voices that stream, and
VITS-style voices that synthesise a text piece at once.

One model per process, shared by every session through one priority worker
thread: one inference at a time, a reply's first piece first. An XTTS piece
is a generator (``inference_stream``) whose every chunk is one job, so the
sessions speaking at once interleave between chunks, and a barge-in closes
the generator before its next chunk. The model comes from a Coqui model
folder (``config.json`` and ``model.pth``) or from the ``.pth`` file with its
``config.json`` beside it; start-up never downloads anything.

Voices: a multi-speaker VITS's speaker names (``--tts-voice NAME`` picks the
default); for XTTS the cloned voices of ``--tts-voice`` (a speaker wav, or a
folder of them, each named by its file name) followed by the named speakers of
the model's ``speakers_xtts.pth`` (XTTS-v2 ships 58). A cloned voice's
conditioning latents are computed once, at start-up.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import numpy as np

from voice_agent.backends.base import PriorityInferenceWorker
from voice_agent.backends.registry import BackendUnavailable
from voice_agent.config import Settings

log = logging.getLogger(__name__)

# Tokens of XTTS's GPT per streamed chunk (Coqui's default): ~0.9 s of audio.
XTTS_CHUNK_TOKENS = 20
CHECKPOINT_NAMES = ("model.pth", "model_file.pth", "model_file.pth.tar", "checkpoint.pth")
SPEAKER_FILES = ("speakers.pth", "speakers.json", "speaker_ids.json")
HOW_TO_PROVIDE = (
    "--tts-model takes a Coqui model folder (config.json and model.pth, as `tts --model_name` "
    "downloads into ~/.local/share/tts/<model>) or the model's .pth file with its config.json "
    "beside it; for XTTS-v2 the folder of https://huggingface.co/coqui/XTTS-v2."
)


def _model_files(reference: str) -> tuple[Path, Path]:
    """The checkpoint and config.json a --tts-model value names."""
    path = Path(reference).expanduser()
    if not path.exists():
        raise BackendUnavailable(f"Coqui model not found: {path}. " + HOW_TO_PROVIDE)
    if path.is_file():
        checkpoint, folder = path, path.parent
    else:
        folder = path
        found = [folder / name for name in CHECKPOINT_NAMES if (folder / name).is_file()]
        if not found:
            raise BackendUnavailable(
                f"Coqui model folder {folder} holds no {' or '.join(CHECKPOINT_NAMES)}. "
                + HOW_TO_PROVIDE
            )
        checkpoint = found[0]
    config = folder / "config.json"
    if not config.is_file():
        raise BackendUnavailable(f"Coqui model {checkpoint} has no config.json beside it. ")
    return checkpoint, config


def _load_config(path: Path) -> Any:
    from TTS.config import load_config

    try:
        json.loads(path.read_text(encoding="utf-8"))
        return load_config(str(path))
    except Exception as exc:
        raise BackendUnavailable(
            f"Coqui model config {path} is not a valid Coqui config: {type(exc).__name__}: {exc}"
        ) from None


def _localise_speakers_file(config: Any, folder: Path) -> None:
    """A model's config names its speakers file where it was trained (or
    downloaded); use the copy in the model's folder when that path is gone."""
    local = next((folder / name for name in SPEAKER_FILES if (folder / name).is_file()), None)
    for holder in (config, config.get("model_args")):
        if holder is None or not holder.get("speakers_file"):
            continue
        named = Path(holder["speakers_file"])
        if not named.is_file():
            if local is None:
                raise BackendUnavailable(
                    f"Coqui model {folder}: its speakers file {named} does not exist and the "
                    f"folder holds none of {', '.join(SPEAKER_FILES)}"
                )
            holder["speakers_file"] = str(local)


def _speaker_wavs(reference: str | None) -> dict[str, Path]:
    """--tts-voice for XTTS: one wav, or a folder of them (by name)."""
    if reference is None:
        return {}
    path = Path(reference).expanduser()
    if path.is_file():
        return {path.stem: path}
    if path.is_dir():
        wavs = {wav.stem: wav for wav in sorted(path.glob("*.wav"))}
        if wavs:
            return wavs
        raise BackendUnavailable(f"--tts-voice folder {path} holds no .wav speaker sample")
    raise BackendUnavailable(
        f"--tts-voice {path} does not exist (for XTTS: a speaker wav or a folder of them)"
    )


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

        checkpoint, config_path = _model_files(model)
        config = _load_config(config_path)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise BackendUnavailable("--tts-device cuda was asked for but torch sees no CUDA GPU")
        if device == "cpu":
            torch.set_num_threads(threads)
        self._torch = torch
        self.device = device
        self.model_path = checkpoint
        self.streams = bool(config.get("model") == "xtts")
        started = time.perf_counter()
        self._model = self._load(config, checkpoint, config_path.parent)
        self._config = config
        self._speed = speed
        self._worker = PriorityInferenceWorker("tts")
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False
        self.counters = CoquiStats()
        if self.streams:
            languages = list(config.get("languages") or ["en"])
            self._language = language if language in languages else languages[0]
            self._latents = self._xtts_voices(voice)
            self._voices: list[str] = list(self._latents)
            self.sample_rate = int(config.model_args.output_sample_rate)
        else:
            self._language = language
            self._voices = self._vits_voices(voice, checkpoint)
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
    def from_settings(cls, settings: Settings) -> Self:
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

    def _load(self, config: Any, checkpoint: Path, folder: Path) -> Any:
        from TTS.tts.models import setup_model

        try:
            _localise_speakers_file(config, folder)
            model = setup_model(config)
            if self.streams:
                model.load_checkpoint(
                    config, checkpoint_dir=str(folder), checkpoint_path=str(checkpoint), eval=True
                )
            else:
                model.load_checkpoint(config, checkpoint_path=str(checkpoint), eval=True)
        except BackendUnavailable:
            raise
        except Exception as exc:
            raise BackendUnavailable(
                f"cannot load Coqui model {checkpoint}: {type(exc).__name__}: {exc}. "
                + HOW_TO_PROVIDE
            ) from None
        model.to(self._torch.device(self.device))
        model.eval()
        return model

    def _vits_voices(self, voice: str | None, checkpoint: Path) -> list[str]:
        manager = getattr(self._model, "speaker_manager", None)
        names = [str(n) for n in manager.speaker_names] if manager is not None else []
        if not names:  # one speaker: named after its model
            names = [checkpoint.parent.name if checkpoint.name == "model.pth" else checkpoint.stem]
            return names
        if voice is not None:
            if voice not in names:
                raise BackendUnavailable(
                    f"--tts-voice {voice!r} is not a speaker of {checkpoint} "
                    f"(speakers: {', '.join(names)})"
                )
            names.remove(voice)
            names.insert(0, voice)
        return names

    def _xtts_voices(self, voice: str | None) -> dict[str, tuple[Any, Any]]:
        """Each voice's (GPT conditioning latents, speaker embedding), once."""
        latents: dict[str, tuple[Any, Any]] = {}
        config = self._config
        for name, wav in _speaker_wavs(voice).items():
            try:
                latents[name] = self._model.get_conditioning_latents(
                    audio_path=[str(wav)],
                    max_ref_length=config.max_ref_len,
                    gpt_cond_len=config.gpt_cond_len,
                    gpt_cond_chunk_len=config.gpt_cond_chunk_len,
                    sound_norm_refs=config.sound_norm_refs,
                )
            except Exception as exc:
                raise BackendUnavailable(
                    f"cannot clone the voice in {wav}: {type(exc).__name__}: {exc}"
                ) from None
        manager = getattr(self._model, "speaker_manager", None)
        for name, speaker in manager.speakers.items() if manager is not None else ():
            latents.setdefault(
                str(name), (speaker["gpt_cond_latent"], speaker["speaker_embedding"])
            )
        if not latents:
            raise BackendUnavailable(
                f"XTTS model {self.model_path} has no speakers (no speakers_xtts.pth beside it): "
                "pass --tts-voice speaker.wav (a few seconds of clean speech) or a folder of wavs"
            )
        return latents

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


def create(settings: Settings) -> CoquiTts:
    return CoquiTts.from_settings(settings)
