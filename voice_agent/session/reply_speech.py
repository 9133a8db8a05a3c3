"""A reply's words made into audio: each piece of text through the TTS,
resampled to the output rate, onto the queue the play task reads.

The first piece starts at its first audible sound (the voice's lead-in is
cut) and is asked of the TTS as urgent; every piece ends with a marker
chunk, so a piece whose stream broke off is told apart from one played in
full. A text-only reply still sends its pieces, with no audio. Apart from
the response because it is the one place the TTS is driven; the response
decides what to say and when, this part only how it sounds.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from voice_agent.audio.pcm import sound_onset
from voice_agent.audio.resample import StreamResampler
from voice_agent.backends.base import BackendError, TtsBackend, public_message
from voice_agent.session.events import FunctionCallRequested
from voice_agent.session.metrics import TurnMetrics, now
from voice_agent.session.reply_pieces import Piece, ReplyPieces

if TYPE_CHECKING:
    from voice_agent.session.reply import ReplySettings

# A reply's leading near-silence: below -40 dBFS (peak) is not heard yet;
# 10 ms of it is kept so the onset is not clipped.
LEAD_THRESHOLD = 328
LEAD_KEPT_S = 0.010
_NO_AUDIO = np.zeros(0, dtype=np.int16)


@dataclass(frozen=True)
class Chunk:
    """Audio of a piece as the TTS made it (the first one carries its words)."""

    piece: Piece
    audio: np.ndarray
    last: bool = False  # no audio: the piece's chunks have all come before it


class SynthesisError(BackendError):
    """The TTS could not speak a piece of the reply."""

    code = "tts_error"


class ReplySpeech:
    """Speaks the reply's pieces (a mixin of ``Reply``, over its state)."""

    audio: bool
    tts: TtsBackend
    voice: str | None
    reply: ReplySettings
    metrics: TurnMetrics
    _queue: asyncio.Queue[Chunk | FunctionCallRequested | None]
    _pieces: ReplyPieces
    _resampler: StreamResampler
    _next_index: int

    async def _flush_audio(self) -> None:
        """The resampler's last samples, as a silent-text piece."""
        if not self.audio:
            return
        tail = self._resampler.process(np.zeros(0, dtype=np.int16), last=True)
        if tail.size:
            piece = self._pieces.new(self._next_index, "")
            await self._queue.put(Chunk(piece, tail))
            await self._queue.put(Chunk(piece, _NO_AUDIO, last=True))
            self._next_index += 1

    async def _speak(self, texts: list[str]) -> None:
        for text in texts:
            await self._synthesize(self._next_index, text)
            self._next_index += 1

    async def _synthesize(self, index: int, text: str) -> None:
        piece = self._pieces.new(index, text)
        if not self.audio:
            await self._queue.put(Chunk(piece, _NO_AUDIO, last=True))
            return
        first = index == 0
        if first:
            self.metrics.first_piece = self.metrics.tts_start = now()
        trimming = first and self.reply.trim_lead
        chunks = self.tts.stream(text, self.voice, urgent=first)
        try:
            async for made in chunks:
                if trimming:
                    # Until the voice is heard: the first frame on the wire is sound.
                    onset = sound_onset(
                        made, LEAD_THRESHOLD, int(LEAD_KEPT_S * self.tts.sample_rate)
                    )
                    if onset is None:
                        continue
                    made, trimming = made[onset:], False
                audio = self._resampler.process(made)
                if not audio.size:
                    continue
                if first and self.metrics.tts_first_audio is None:
                    self.metrics.tts_first_audio = now()
                await self._queue.put(Chunk(piece, audio))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise SynthesisError(
                f"speech synthesis failed: {type(exc).__name__}: {exc}",
                f"speech synthesis failed: {public_message(exc)}",
            ) from exc
        finally:
            # Stops the backend before its next chunk (a barge-in, a failure).
            await chunks.aclose()  # type: ignore[attr-defined]
        # Also a piece without audio: its words are still the reply's.
        await self._queue.put(Chunk(piece, _NO_AUDIO, last=True))
