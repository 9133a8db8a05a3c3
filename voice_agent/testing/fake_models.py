"""Stand-ins for the speech *models*, so the tests of everything around them
(signaling, the Realtime protocol, HTTP endpoints, auth, limits, sessions)
run in a fraction of a second, on any machine, without Whisper or Piper.

They replace the models only: the engine, the session graph, the VAD (a
cheap GMM, not a model), the turn logic, the LLM client and the resampling
and pacing of their audio all stay the real code. The LLM's stand-in is the
scripted server (``scripted_llm.py``), reached over real HTTP.

Importing this module registers both as backends named ``fake``
(``--stt fake``, ``--tts fake``), created through the registry as any other.
Both are deterministic, so a test can assert on what they give:

- ``FakeStt`` answers a transcript queued with ``script()`` when there is one,
  else one derived from the audio, "<N> milliseconds of speech", ``N`` the
  length of its 20 ms frames louder than a whisper (none: no words, as a
  real model says nothing on silence).
- ``FakeTts`` says each word as a quiet tone of ``WORD_MS``, one chunk a
  word, at the rate it declares, as a streaming backend yields, and stops
  before the next chunk when its consumer stops reading or is cancelled.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter, deque
from collections.abc import AsyncGenerator, Sequence

import numpy as np

from voice_agent.backends import registry
from voice_agent.backends.base import BackendError
from voice_agent.config.stt import SttSettings
from voice_agent.config.tts import TtsSettings

STT_RATE = 16_000
FRAME_MS = 20  # the frame the session's VAD judges
FRAME_SAMPLES = STT_RATE * FRAME_MS // 1000
# A frame's RMS above this (about -40 dBFS) is speech to the fake STT: well
# above a silent track's dither, well below any recorded voice.
SPEECH_RMS = 330.0

TTS_RATE = 22_050  # Piper's: the session resamples it to the outbound 48 kHz
WORD_MS = 100
# Quiet next to a voice (peaks at about -21 dBFS; recorded voices reach -6),
# yet plainly sound: past the reply's lead trim (LEAD_THRESHOLD, 328) and
# the peaks the tests take for "something was heard" (500 to 2,000).
TONE_AMPLITUDE = 3_000
# Two voices, so a voice change can be told apart in the audio.
VOICES: dict[str, float] = {"fake": 220.0, "fake-high": 440.0}


class FakeModelError(BackendError):
    """A failure a test asked a fake for (``fail_next``), as a model's would be."""


def speech_ms(audio: np.ndarray) -> int:
    """How many milliseconds of 16 kHz int16 ``audio`` are louder than a
    whisper, counted in whole 20 ms frames."""
    frames = len(audio) // FRAME_SAMPLES
    if not frames:
        return 0
    blocks = audio[: frames * FRAME_SAMPLES].astype(np.float64).reshape(frames, FRAME_SAMPLES)
    loud = np.sqrt(np.mean(np.square(blocks), axis=1)) > SPEECH_RMS
    return int(np.count_nonzero(loud)) * FRAME_MS


def derived_transcript(audio: np.ndarray) -> str:
    """The fake STT's words for ``audio`` when none are scripted."""
    ms = speech_ms(audio)
    return f"{ms} milliseconds of speech" if ms else ""


class FakeStt:
    """Speech-to-text without a model. Like a remote STT it offers plain
    ``transcribe`` (no careful redecode, no speculative shedding); it also
    transcribes partials, off unless ``--stt-partial-interval-ms`` turns
    them on, as Whisper's shared lane is."""

    name = "fake"
    default_partial_interval_ms = 0

    def __init__(self) -> None:
        self._scripted: deque[str] = deque()
        self._failures = 0
        self.heard: list[str] = []  # every transcript given, in order (finals and speculations)
        self.requests: Counter[str] = Counter()
        self.warmed_up = False
        self.closed = False

    def script(self, *transcripts: str) -> None:
        """Queue transcripts: each transcription (a speculation at a pause
        included, partials excepted) takes the next, before deriving one."""
        self._scripted.extend(transcripts)

    def fail_next(self, count: int = 1) -> None:
        """The next ``count`` transcriptions raise ``FakeModelError``."""
        self._failures += count

    async def warm_up(self) -> None:
        """A local model's warm-up, called by the engine when it preloads
        (nothing to initialise: it only says it was asked)."""
        self._check_open()
        await asyncio.sleep(0)
        self.warmed_up = True

    async def transcribe(self, audio: np.ndarray) -> str:
        self._check_open()
        self.requests["final"] += 1
        await asyncio.sleep(0)  # a real model is awaited: let others run, be cancellable
        if self._failures:
            self._failures -= 1
            raise FakeModelError("fake STT failure, as asked")
        text = self._scripted.popleft() if self._scripted else derived_transcript(audio)
        self.heard.append(text)
        return text

    async def transcribe_partial(self, audio: np.ndarray) -> str | None:
        """The words so far: always derived (scripted ones are for turns)."""
        self._check_open()
        self.requests["partial"] += 1
        await asyncio.sleep(0)
        return derived_transcript(audio)

    def stats(self) -> dict[str, object]:
        """For ``/v1/stats``, as the embedded backends report theirs."""
        return {"backend": self.name, "requests": dict(self.requests)}

    def _check_open(self) -> None:
        if self.closed:
            raise FakeModelError("the fake STT is closed")

    def close(self) -> None:
        self.closed = True


class FakeTts:
    """Text-to-speech without a model: ``WORD_MS`` of tone a word."""

    name = "fake"

    def __init__(self, sample_rate: int = TTS_RATE, word_ms: int = WORD_MS) -> None:
        self.sample_rate = sample_rate
        self.word_samples = sample_rate * word_ms // 1000
        self.spoken: list[tuple[str, str, bool]] = []  # (text, voice, urgent), each piece asked
        self.chunks_sent = 0
        self.cancelled = 0  # pieces stopped before their last chunk
        self._failures = 0
        self.closed = False

    def voices(self) -> Sequence[str]:
        return tuple(VOICES)

    def fail_next(self, count: int = 1) -> None:
        """The next ``count`` pieces raise ``FakeModelError`` before any audio."""
        self._failures += count

    def duration_s(self, text: str) -> float:
        """How long ``text`` is said, in seconds."""
        return len(words(text)) * self.word_samples / self.sample_rate

    async def stream(
        self, text: str, voice: str | None = None, urgent: bool = False
    ) -> AsyncGenerator[np.ndarray, None]:
        """The words' tones, a chunk a word (an async generator: closing it,
        as the session does, stops it before the next chunk)."""
        if self.closed:
            raise FakeModelError("the fake TTS is closed")
        name = self.voices()[0] if voice is None else voice
        if name not in VOICES:  # as Piper refuses a voice it does not have
            raise ValueError(f"no fake voice {name!r} (voices: {', '.join(VOICES)})")
        self.spoken.append((text, name, urgent))
        if self._failures:
            self._failures -= 1
            raise FakeModelError("fake TTS failure, as asked")
        said = words(text)
        finished = False
        try:
            for index in range(len(said)):
                await asyncio.sleep(0)  # a cancelled consumer stops it here
                self.chunks_sent += 1
                yield self._tone(index, VOICES[name])
            finished = True
        finally:
            if not finished:
                self.cancelled += 1

    def _tone(self, index: int, frequency: float) -> np.ndarray:
        """Word ``index``'s samples: one sine, continuous from word to word."""
        start = index * self.word_samples
        t = np.arange(start, start + self.word_samples) / self.sample_rate
        tone = TONE_AMPLITUDE * np.sin(2 * np.pi * frequency * t)
        return tone.astype(np.int16)

    def close(self) -> None:
        self.closed = True


def words(text: str) -> list[str]:
    """The words the fake TTS says (and so the chunks it yields) for ``text``."""
    return re.findall(r"[\w']+", text)


def create_stt(settings: SttSettings) -> FakeStt:
    return FakeStt()


def create_tts(settings: TtsSettings) -> FakeTts:
    return FakeTts()


_HINT = "import voice_agent.testing.fake_models (tests only)"
registry.register(
    registry.BackendSpec(
        "stt",
        "fake",
        "Test double: scripted or audio-length transcripts, no model",
        "voice_agent.testing.fake_models:create_stt",
        (),
        _HINT,
    )
)
registry.register(
    registry.BackendSpec(
        "tts",
        "fake",
        "Test double: a quiet tone a word, no model",
        "voice_agent.testing.fake_models:create_tts",
        (),
        _HINT,
    )
)
