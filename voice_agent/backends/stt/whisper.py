"""faster-whisper (CTranslate2) speech-to-text, one model per process: the
backend that sessions call, and its ``create()`` factory.

It loads the model (and, for ``--stt-partial-lane idle``, a second copy at
idle priority) and feeds every session's requests to one batching worker:
finals first, speculations and partials shed while finals wait, an abandoned
request skipped. What a batch becomes (the trimmed window, the silence
padding, the decoding) is whisper_batch.py's.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal, TypeVar

import numpy as np

from voice_agent.backends.capabilities import Transcription
from voice_agent.backends.runtime.batching import BatchingWorker
from voice_agent.backends.stt import whisper_weights
from voice_agent.backends.stt.whisper_batch import BatchTranscriber, Utterance
from voice_agent.backends.stt.whisper_onnx_encoder import OnnxWhisperEncoder
from voice_agent.config.stt import SttSettings
from voice_agent.cpu import call_at_idle_priority, default_parallel

if TYPE_CHECKING:  # imported only for CTranslate2 halves or lanes (whisper_tokens.py: why)
    from faster_whisper import WhisperModel

log = logging.getLogger(__name__)
T = TypeVar("T")

# CTranslate2's oneDNN caches the primitives it builds for each input shape,
# up to 1,024 of them. A trimmed window is the utterance's own length, so
# nearly every utterance is a new shape and the cache only grows: ~0.6 MB of
# heap per new shape (measured), for hundreds of calls. Shapes almost never
# repeat, so a small cache costs no speed.
ONEDNN_CACHE_CAPACITY = "32"
# Partials on the idle-priority copy of the model (--stt-partial-lane idle):
# Whisper base takes 0.2-0.5 s a transcription on 2 cores, so each speaking
# caller has about one running.
IDLE_LANE_PARTIAL_INTERVAL_MS = 500
# Partials on the one shared model (--stt-partial-interval-ms, the ONNX
# decoder's): each is the next transcript's draft (whisper_drafts.py), so
# the turn's final, a second of speech or less past it, is mostly checked
# in one step, and its words prefill the LLM. One starts only on an idle
# model that transcripts that matter (finals, speculations) kept busy less
# than PARTIAL_BUSY_SHARE of the last 3 s. Off by default: one caller's
# replies came sooner (paired median ratio 0.865 on read sentences, none on
# short prompts), but five callers' p95 rose 0.2-1.3 s in 5 of 6 runs, this
# rule's included: partials start in the gaps between other callers'
# transcripts and compete with their replies (bench/RESULTS.md).
PARTIAL_BUSY_SHARE = 0.3


class FasterWhisperStt:
    name = "faster-whisper"

    def __init__(
        self,
        model: str,
        language: str | None,
        threads: int,
        window: Literal["trim", "full"] = "trim",
        max_batch: int = 4,
        batch_wait_ms: int = 0,
        max_speculative_batch: int = 2,
        parallel: int = 1,
        partial_max_s: float = 8.0,
        partial_lane: Literal["idle", "shared"] = "shared",
        decoder: Literal["onnx", "ctranslate2"] = "onnx",
        encoder: Literal["onnx", "ctranslate2"] = "onnx",
    ) -> None:
        self._partial_max_samples = int(partial_max_s * 16000)
        self._partials_too_long = 0
        path = whisper_weights.resolve(model)
        # Read by oneDNN when it creates its first primitive; a value the
        # operator set in the environment wins.
        os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", ONEDNN_CACHE_CAPACITY)
        # CTranslate2 holds the whole model even to run one half of it: it is
        # loaded only where a half runs on it.
        self._model: WhisperModel | None = None
        if "ctranslate2" in (encoder, decoder) or partial_lane == "idle":
            from faster_whisper import WhisperModel
        if "ctranslate2" in (encoder, decoder):
            # num_workers: CTranslate2 runs that many calls at once, one per
            # batch the worker lets run side by side (``parallel``).
            self._model = WhisperModel(
                str(path),
                device="cpu",
                compute_type="int8",
                cpu_threads=threads,
                num_workers=parallel,
            )
        onnx_encoder = (
            OnnxWhisperEncoder(path, threads, copies=parallel) if encoder == "onnx" else None
        )
        # Partials on a second copy of the model whose compute threads run at
        # the OS's idle priority: CTranslate2 computes in threads the model
        # creates, which inherit the creating thread's scheduling policy. A
        # partial then takes only CPU nothing else wants, and one still
        # running when the user pauses barely slows the transcript that
        # matters (measured: +16-53 ms on a final that ran beside a whole
        # partial, against +200-260 ms on one model). The thread that feeds
        # the model (and holds the GIL between calls) keeps its priority.
        self._partial_model: WhisperModel | None = None
        if partial_lane == "idle":
            self._partial_model = call_at_idle_priority(
                lambda: WhisperModel(
                    str(path), device="cpu", compute_type="int8", cpu_threads=threads, num_workers=1
                ),
            )
        self.default_partial_interval_ms = (
            IDLE_LANE_PARTIAL_INTERVAL_MS if partial_lane == "idle" else 0
        )
        self._partials_busy = 0
        self._batches = BatchTranscriber(
            self._model, path, language or "en", window, threads, parallel, decoder, onnx_encoder
        )
        # One worker for every session: finals first; speculative work (the
        # turn so far, transcribed at a pause) is the low priority that is
        # shed (None) while finals wait, so it never delays one.
        self._worker: BatchingWorker[Utterance, Transcription] = BatchingWorker(
            "stt-batch",
            self._batches.transcribe_batch,
            max_batch,
            batch_wait_ms / 1000.0,
            max_partial_batch=max_speculative_batch,
            parallel=parallel,
            # A safe re-decode (the full window) batches only with its kind,
            # after the fast finals waiting: it never delays theirs. Live
            # partials likewise go after the speculations waiting, never in
            # their batch (where a speculation would wait for the partial's
            # decoding too, and lose its draft: only one alone takes one).
            rank=lambda utterance: int(utterance.careful) + 2 * int(utterance.live),
            optional=lambda utterance: utterance.live,
        )
        self._partial_worker: BatchingWorker[Utterance, Transcription] | None = None
        if self._partial_model is not None:
            partial_model = self._partial_model
            self._partial_worker = BatchingWorker(
                "stt-partial",
                lambda batch: self._batches.transcribe_batch(batch, partial_model),
                max_speculative_batch,
                batch_wait_ms / 1000.0,
                max_partial_batch=max_speculative_batch,
            )
        log.info(
            "stt model loaded",
            extra={
                "model": model,
                "path": str(path),
                "window": window,
                "partial_lane": partial_lane,
                "decoder": decoder,
                "encoder": encoder,
            },
        )

    async def warm_up(self) -> None:
        await self.transcribe(np.zeros(16000, dtype=np.int16))
        if self._partial_worker is not None:
            await self._partial_worker.submit(Utterance(np.zeros(16000, dtype=np.int16)))

    async def transcribe(self, audio: np.ndarray) -> str:
        return (await _submitted(self._worker.submit, Utterance(audio))).text

    async def transcribe_speculative(self, audio: np.ndarray) -> str | None:
        result = await _submitted(self._worker.submit_partial, Utterance(audio))
        return None if result is None else result.text

    async def transcribe_detailed(
        self, audio: np.ndarray, *, careful: bool = False, speculative: bool = False
    ) -> Transcription | None:
        utterance = Utterance(audio, careful=careful)
        if speculative:
            return await _submitted(self._worker.submit_partial, utterance)
        return await _submitted(self._worker.submit, utterance)

    async def transcribe_partial(self, audio: np.ndarray) -> str | None:
        """Speech in progress, on a model with nothing else to do; None
        (skipped) when anything waits or runs on it, finals and speculations
        kept the shared model busy more than PARTIAL_BUSY_SHARE of the last
        3 s, or the turn is past --stt-partial-max-s."""
        if len(audio) > self._partial_max_samples:
            self._partials_too_long += 1
            return None
        if self._partial_worker is None:
            if self._worker.busy or self._worker.busy_share.share() > PARTIAL_BUSY_SHARE:
                self._partials_busy += 1
                return None
            worker = self._worker
        elif self._worker.busy:
            # A transcript that matters is being made: a partial now would
            # only compete with it (and partials are worth least under load).
            self._partial_worker.stats.requests["partial_skipped"] += 1
            return None
        else:
            worker = self._partial_worker
        result = await _submitted(worker.submit_partial, Utterance(audio, live=True))
        return None if result is None else result.text

    @property
    def in_flight(self) -> int:
        """Requests the main model is transcribing now."""
        return self._worker.in_flight

    def stats(self) -> dict[str, object]:
        return {
            "backend": self.name,
            **self._worker.stats.snapshot(),
            "partial_too_long": self._partials_too_long,
            "partial_model_busy": self._partials_busy,
            "abandoned_after_encoding": self._batches.abandoned_after_encoding,
            "abandoned_while_decoding": self._batches.abandoned_while_decoding,
            # Decoded with a draft: the same turn's transcript at an earlier pause.
            "drafted": self._batches.recent.drafted,
            **(
                {"partial_lane": self._partial_worker.stats.snapshot()}
                if self._partial_worker is not None
                else {}
            ),
        }

    def close(self) -> None:
        self._worker.close()
        if self._partial_worker is not None:
            self._partial_worker.close()


async def _submitted(submit: Callable[[Utterance], Awaitable[T]], utterance: Utterance) -> T:
    """``submit`` the utterance; if the caller goes away meanwhile, the worker
    thread sees it abandoned and skips what is left of it."""
    try:
        return await submit(utterance)
    except asyncio.CancelledError:
        utterance.abandoned = True
        raise


def create(settings: SttSettings) -> FasterWhisperStt:
    return FasterWhisperStt(
        settings.stt_model,
        settings.stt_language,
        settings.stt_threads,
        settings.stt_window,
        max_batch=settings.stt_max_batch,
        batch_wait_ms=settings.stt_batch_wait_ms,
        max_speculative_batch=settings.stt_partial_max_batch,
        parallel=settings.stt_parallel or default_parallel(settings.stt_threads),
        partial_max_s=settings.stt_partial_max_s,
        partial_lane=settings.stt_partial_lane,
        decoder=settings.stt_decoder,
        encoder=settings.stt_encoder,
    )
