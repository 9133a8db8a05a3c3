"""Optional abilities a backend may have beyond its kind's protocol.

Checked with ``isinstance`` at run time, so a backend without them (the
embedded faster-whisper, say) needs no stubs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class PartialTranscriber(Protocol):
    """Transcribes speech still in progress at low priority."""

    default_partial_interval_ms: int

    async def transcribe_partial(self, audio: np.ndarray) -> str | None:
        """Transcript of 16 kHz int16 audio so far, or None when the model is
        busy with final transcripts or the audio is longer than the backend
        allows for partials (the partial is skipped, not queued)."""
        ...


@runtime_checkable
class SpeculativeTranscriber(Protocol):
    """Transcribes the turn so far at a pause, ahead of the end of the turn,
    at low priority: under load this work is shed first."""

    async def transcribe_speculative(self, audio: np.ndarray) -> str | None:
        """Transcript of 16 kHz int16 audio, or None when finals are waiting
        or running (the speculation is dropped; the final will do the work)."""
        ...


@runtime_checkable
class WarmsUp(Protocol):
    """A local model whose first call pays for lazy initialisation. Remote
    backends lack this: a warm-up request to them would be billed."""

    async def warm_up(self) -> None:
        """Run the model once at start-up."""
        ...


@runtime_checkable
class ReleasesMemory(Protocol):
    """A local model that keeps buffers between calls for speed, and can
    give them back when the service is idle."""

    async def release_memory(self) -> None:
        """Give back what is kept between calls; the next call rebuilds it."""
        ...


@runtime_checkable
class ClosesAsync(Protocol):
    """Holds connections that can only be closed on the event loop."""

    async def aclose(self) -> None: ...


@runtime_checkable
class ReportsStats(Protocol):
    def stats(self) -> dict[str, object]:
        """JSON-ready counters for ``/v1/stats``."""
        ...


# Whisper's own thresholds for the evidence below: nobody spoke when the
# no-speech probability is above the first and the mean log-probability
# below the second; a decode below the second alone is not to be trusted.
NO_SPEECH_THRESHOLD = 0.6
LOGPROB_THRESHOLD = -1.0


@dataclass(frozen=True)
class Transcription:
    """A transcript with the model's own evidence about it, for the checks
    that decide whether to trust a fast decode (stages/transcript_check.py).
    None means the backend cannot say."""

    text: str
    no_speech_prob: float | None = None  # the model's belief that nobody spoke
    avg_logprob: float | None = None  # mean log-probability of the decoded tokens
    truncated: bool = False  # the decoder's length limit stopped it mid-way
    careful: bool = False  # decoded the safe (slower) way


@runtime_checkable
class CarefulTranscriber(Protocol):
    """Has a fast path and a safe one, and says how sure it is of each
    transcript. A fast transcript the checks distrust is decoded again the
    safe way before the turn is answered."""

    async def transcribe_detailed(
        self, audio: np.ndarray, *, careful: bool = False, speculative: bool = False
    ) -> Transcription | None:
        """Transcript of 16 kHz int16 audio with its evidence; ``careful``
        asks for the safe way. None only when ``speculative`` and the work
        was shed (finals wait)."""
        ...
