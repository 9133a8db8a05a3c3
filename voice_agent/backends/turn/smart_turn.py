"""Smart Turn v3.2: an audio model that says whether a caller has finished
their turn (pipecat's, BSD-2-Clause, 8M parameters, 8.7 MB int8 ONNX).

It hears the last 8 s of the turn as Whisper-style log-mel features and
answers a probability that the turn is complete: it hears the falling pitch
of a finished sentence and the held vowel of "my number is ...", which a
silence timer cannot. The weights ship inside the ``pipecat-ai`` wheel on
PyPI; they are found through the package's file list, never by importing
pipecat (its runtime and dependencies are not installed here).

One model serves every session of the process, in its one thread
(BatchingWorker), never on the event loop. Judgements that arrive together
can run as one batch (``max_batch``), but on CPU a batch of N costs N single
judgements (measured on 2 cores: 49, 98, 188, 386 ms for 1, 2, 4, 8), so
the default takes them one at a time and the first pause is answered first.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
from pathlib import Path

import numpy as np
import onnxruntime

from voice_agent.audio.log_mel import LogMel
from voice_agent.backends.registry import BackendUnavailable
from voice_agent.backends.runtime.batching import BatchingWorker
from voice_agent.backends.runtime.onnx_options import quiet_session_options
from voice_agent.config.listening import ListeningSettings

log = logging.getLogger(__name__)

SAMPLE_RATE = 16_000
WINDOW_S = 8
WINDOW_SAMPLES = WINDOW_S * SAMPLE_RATE
DISTRIBUTION = "pipecat-ai"
DISTRIBUTION_VERSION = "1.14.0"
WEIGHTS = "pipecat/audio/turn/smart_turn/data/smart-turn-v3.2-cpu.onnx"
WEIGHTS_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
INSTALL_HINT = (
    f"pip install --no-deps {DISTRIBUTION}=={DISTRIBUTION_VERSION} (make install does this), "
    "or --turn-model PATH to the ONNX file, or --turn-backend silence"
)


class TurnWeightsUnavailable(BackendUnavailable):
    """The Smart Turn weights are not installed; the message says how."""


def packaged_weights() -> Path:
    """The ONNX file inside the installed pipecat-ai wheel."""
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise TurnWeightsUnavailable(f"smart-turn needs its weights: {INSTALL_HINT}") from None
    path = Path(str(distribution.locate_file(WEIGHTS)))
    if not path.is_file():
        raise TurnWeightsUnavailable(
            f"{DISTRIBUTION} {distribution.version} holds no {WEIGHTS}: {INSTALL_HINT}"
        )
    return path


def verified(path: Path, expected: str = WEIGHTS_SHA256) -> Path:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != expected:
        raise TurnWeightsUnavailable(
            f"{path} is not Smart Turn v3.2 (sha256 {digest[:12]}, expected {expected[:12]})"
        )
    return path


class SmartTurnFeatures:
    """Whisper's log-mel features of the last 8 s, as the model expects
    them: shorter turns padded with digital silence at the start, then the
    whole window normalised to zero mean and unit variance."""

    def __init__(self) -> None:
        self._extractor = LogMel(80)

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        samples = audio[-WINDOW_SAMPLES:]
        window = np.zeros(WINDOW_SAMPLES, dtype=np.float32)
        window[WINDOW_SAMPLES - len(samples) :] = samples.astype(np.float32) / 32768.0
        window = (window - window.mean()) / np.sqrt(window.var() + 1e-7)
        features: np.ndarray = self._extractor(window, padding=0)  # 800 frames
        return features


class SmartTurn:
    """The ``turn`` backend: ``completion(audio)`` is the probability that
    the turn in ``audio`` (16 kHz int16, the turn so far with its trailing
    silence) is finished."""

    name = "smart-turn"
    semantic = True

    def __init__(
        self, path: Path, max_batch: int = 1, batch_wait_ms: float = 2.0, threads: int = 1
    ) -> None:
        # One thread: two were slower on 2 cores, and the STT and TTS need
        # the other core at the very moment a turn ends.
        options = quiet_session_options(threads)
        # No arena: it kept ~19 MB in every process that holds calls for a
        # judgement's buffers, which cost ~1 ms more to allocate each time
        # (42.1 against 43.3 ms, paired medians on 2 cores).
        options.enable_cpu_mem_arena = False
        self._session = onnxruntime.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._features = SmartTurnFeatures()
        self._worker: BatchingWorker[np.ndarray, float] = BatchingWorker(
            "turn-batch",
            self._judge_batch,
            max_batch,
            batch_wait_ms / 1000.0,
            # Not niced like the STT: ~50 ms that every turn's end waits on,
            # which must not queue behind other callers' transcripts.
            lowered=False,
        )
        log.info("turn model loaded", extra={"path": str(path)})

    def _judge_batch(self, batch: list[np.ndarray]) -> list[float]:
        features = np.stack([self._features(audio) for audio in batch])
        (probabilities,) = self._session.run(None, {"input_features": features})
        return [float(p) for p in np.asarray(probabilities).reshape(-1)]

    async def completion(self, audio: np.ndarray) -> float:
        return await self._worker.submit(audio)

    async def warm_up(self) -> None:
        await self.completion(np.zeros(SAMPLE_RATE, dtype=np.int16))

    def stats(self) -> dict[str, object]:
        return {"name": self.name, "batching": self._worker.stats.snapshot()}

    def close(self) -> None:
        self._worker.close()


def create(settings: ListeningSettings) -> SmartTurn:
    if settings.turn_model:
        path = Path(settings.turn_model).expanduser()
        if not path.is_file():
            raise TurnWeightsUnavailable(f"--turn-model {path}: no such file")
    else:
        path = verified(packaged_weights())
    return SmartTurn(path, max_batch=settings.turn_max_batch)
