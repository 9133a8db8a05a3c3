"""NVIDIA Parakeet (and any NeMo ASR model: TDT, RNNT, CTC) speech-to-text.

One model per process, shared by every session through a dynamic batching
worker. On CUDA it runs under half-precision autocast; on the CPU in fp32.
The model comes from a ``.nemo`` file, from a Hugging Face repo id
("org/name") already in the local Hugging Face cache, or from one of NeMo's
own pretrained names (no slash) already in NeMo's cache: start-up never
downloads, and says exactly how to provide the model when it is missing.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from voice_agent.audio.pcm import int16_to_float
from voice_agent.backends.capabilities import Transcription
from voice_agent.backends.registry import BackendUnavailable
from voice_agent.backends.runtime.batching import BatchingWorker
from voice_agent.config.stt import SttSettings

log = logging.getLogger(__name__)

DEFAULT_MODEL = "nvidia/parakeet-tdt-0.6b-v2"
# Below ~0.1 s a FastConformer's 8x subsampling leaves nothing to decode.
MIN_SAMPLES = 1600
# The safe way: the turn with this much silence on either side, so a word
# at the very edge of the audio still has the context its convolutions and
# the transducer's last frames need.
CAREFUL_PAD_SAMPLES = 8000

HOW_TO_PROVIDE = (
    "Pass --stt-model /path/to/model.nemo (for example parakeet-tdt-0.6b-v2.nemo, "
    "downloadable from https://huggingface.co/nvidia/parakeet-tdt-0.6b-v2), or the name of a "
    "pretrained model already in the local Hugging Face cache (populate it on a machine with "
    "network access with `huggingface-cli download {name}` and copy ~/.cache/huggingface, or "
    "set HF_HOME to where it is), or one of NeMo's own pretrained names already in NeMo's cache "
    "(~/.cache/torch/NeMo/NeMo_<version>, or NEMO_CACHE_DIR)."
)


def _nemo_file_for(reference: str) -> Path:
    """The .nemo file a --stt-model value names, without touching the network."""
    path = Path(reference).expanduser()
    if path.is_file():
        return path
    # Anything but an "org/name" repo id or a bare NeMo name is meant as a file.
    if (
        reference.endswith(".nemo")
        or reference.startswith(("/", ".", "~"))
        or (reference.count("/") > 1)
    ):
        raise BackendUnavailable(
            f"parakeet model file {reference} does not exist. "
            + HOW_TO_PROVIDE.format(name=DEFAULT_MODEL)
        )
    if "/" not in reference:
        return _nemo_cache_file(reference)
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(repo_id=reference, local_files_only=True))
    except Exception as exc:  # not cached (or not a valid repo id): never go online
        raise BackendUnavailable(
            f"parakeet model {reference!r} is neither a .nemo file nor in the local Hugging Face "
            f"cache ({type(exc).__name__}). " + HOW_TO_PROVIDE.format(name=reference)
        ) from None
    files = sorted(folder.glob("*.nemo"))
    if not files:
        raise BackendUnavailable(
            f"the cached copy of {reference!r} in {folder} holds no .nemo file. "
            + HOW_TO_PROVIDE.format(name=reference)
        )
    return files[0]


def _nemo_cache_file(name: str) -> Path:
    """Where ``ASRModel.from_pretrained(name)`` keeps its download:
    <cache>/<name>/<md5 of its source>/<name>.nemo."""
    from nemo.utils.data_utils import resolve_cache_dir

    cache = Path(resolve_cache_dir())
    files = sorted(cache.glob(f"{name}/*/{name}.nemo"), key=lambda f: f.stat().st_mtime)
    if not files:
        raise BackendUnavailable(
            f"parakeet model {name!r} is neither a .nemo file nor in NeMo's local cache "
            f"({cache}). " + HOW_TO_PROVIDE.format(name=DEFAULT_MODEL)
        )
    return files[-1]  # the newest download


def _texts(output: Any) -> list[str]:
    """NeMo returns strings or Hypothesis objects; hybrid models a tuple."""
    if isinstance(output, tuple):
        output = output[0]
    return [item if isinstance(item, str) else str(item.text) for item in output]


class ParakeetStt:
    name = "parakeet"
    # Batched and cheap on a GPU (and tens of ms on a CPU for short audio).
    default_partial_interval_ms = 500

    def __init__(
        self,
        model: str,
        device: str,
        threads: int,
        max_batch: int,
        batch_wait_ms: int,
        partial_max_batch: int = 2,
        partial_max_s: float = 8.0,
    ) -> None:
        import torch

        path = _nemo_file_for(model)
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device == "cuda" and not torch.cuda.is_available():
            raise BackendUnavailable("--stt-device cuda was asked for but torch sees no CUDA GPU")
        if device == "cpu":
            torch.set_num_threads(threads)
        logging.getLogger("nemo_logger").setLevel(logging.ERROR)  # per-call chatter
        from nemo.collections.asr.models import ASRModel

        started = time.perf_counter()
        try:
            self._model = ASRModel.restore_from(str(path), map_location=torch.device(device))
        except Exception as exc:
            raise BackendUnavailable(
                f"cannot load parakeet model {path}: {exc}. "
                + HOW_TO_PROVIDE.format(name=DEFAULT_MODEL)
            ) from exc
        self._model.eval()
        self._torch = torch
        self.device = device
        self.model_path = path
        self._worker: BatchingWorker[np.ndarray, str] = BatchingWorker(
            "stt-batch",
            self._transcribe_batch,
            max_batch,
            batch_wait_ms / 1000.0,
            max_partial_batch=partial_max_batch,
        )
        # Each partial re-transcribes the turn so far: past this length a
        # partial batch could hold up a final for too long.
        self._partial_max_samples = int(partial_max_s * 16000)
        self._partials_too_long = 0
        log.info(
            "stt model loaded",
            extra={
                "model": model,
                "path": str(path),
                "device": device,
                "class": type(self._model).__name__,
                "seconds": round(time.perf_counter() - started, 2),
            },
        )

    @contextlib.contextmanager
    def _precision(self) -> Iterator[None]:
        torch = self._torch
        with torch.inference_mode():
            if self.device == "cuda":
                half = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
                with torch.autocast("cuda", dtype=half):
                    yield
            else:
                yield

    def _transcribe_batch(self, batch: list[np.ndarray]) -> Sequence[str]:
        """Runs in the worker's thread."""
        texts = [""] * len(batch)
        index = [i for i, audio in enumerate(batch) if len(audio) >= MIN_SAMPLES]
        if not index:
            return texts
        samples = [int16_to_float(batch[i]) for i in index]
        with self._precision():
            output = self._model.transcribe(samples, batch_size=len(samples), verbose=False)
        for i, text in zip(index, _texts(output), strict=True):
            texts[i] = text.strip()
        return texts

    async def warm_up(self) -> None:
        await self.transcribe(np.zeros(16000, dtype=np.int16))

    async def transcribe(self, audio: np.ndarray) -> str:
        return await self._worker.submit(audio)

    async def transcribe_detailed(
        self, audio: np.ndarray, *, careful: bool = False, speculative: bool = False
    ) -> Transcription | None:
        """NeMo gives no confidence here, so the checks judge the text alone."""
        if careful:
            pad = np.zeros(CAREFUL_PAD_SAMPLES, dtype=np.int16)
            audio = np.concatenate((pad, audio, pad))
        text = await (self.transcribe_speculative(audio) if speculative else self.transcribe(audio))
        return None if text is None else Transcription(text, careful=careful)

    async def transcribe_partial(self, audio: np.ndarray) -> str | None:
        if len(audio) > self._partial_max_samples:
            self._partials_too_long += 1
            return None
        return await self._worker.submit_partial(audio)

    async def transcribe_speculative(self, audio: np.ndarray) -> str | None:
        # The same low priority as partials: shed while finals wait.
        return await self.transcribe_partial(audio)

    def stats(self) -> dict[str, object]:
        return {
            "backend": self.name,
            "device": self.device,
            **self._worker.stats.snapshot(),
            "partial_too_long": self._partials_too_long,
        }

    def close(self) -> None:
        self._worker.close()


def create(settings: SttSettings) -> ParakeetStt:
    model = settings.stt_model
    if "stt_model" not in settings.model_fields_set:
        model = DEFAULT_MODEL  # the default 'base' names a Whisper model
    return ParakeetStt(
        model,
        settings.stt_device,
        settings.stt_threads,
        settings.stt_max_batch,
        settings.stt_batch_wait_ms,
        settings.stt_partial_max_batch,
        settings.stt_partial_max_s,
    )
