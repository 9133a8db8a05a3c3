"""Whisper's encoder on ONNX Runtime (``--stt-encoder onnx``).

Why: CTranslate2 holds the whole model to run either half of it, and it
widens the decoder's 26.5M-entry embedding table to float32 when it loads
int8: Whisper base is 180 MB of CTranslate2's memory, though the decoder
runs on ONNX Runtime (whisper_onnx_decoder.py). The encoder alone as an ONNX
graph (int8 weights but for one float32 product a layer, see
whisper_onnx_graphs.py) is ~46 MB resident; a transcript takes ~7 % longer
than on CTranslate2 on 2 cores (Intel Xeon, bench/stt_runtimes.py), a few
ms a turn.

The graph is built from the packaged model's float16 weights and cached on
disk (whisper_onnx_graphs.py builds it, whisper_graph_cache.py keeps it).
"""

from __future__ import annotations

import logging
import queue
import time
from pathlib import Path

import numpy as np
import onnxruntime

from voice_agent.backends.runtime.onnx_options import quiet_session_options, session_from_bytes
from voice_agent.backends.stt.whisper_graph_cache import encoder_graph

log = logging.getLogger(__name__)


def _session(serialized: bytes, threads: int) -> onnxruntime.InferenceSession:
    options = quiet_session_options(threads)
    # Every window is its own length: an arena would keep the largest
    # batch's buffers (a 30 s window's attention scores are 72 MB a head
    # group) for the life of the process.
    options.enable_cpu_mem_arena = False
    return session_from_bytes(serialized, options)


class OnnxWhisperEncoder:
    """Log-mel windows -> the audio's states, as CTranslate2's
    ``encode(..., to_cpu=True)`` gives them. ``copies`` sessions, one per
    batch the STT runs at once, so concurrent batches never share a thread
    pool."""

    def __init__(self, model_dir: Path, threads: int, copies: int = 1) -> None:
        started = time.monotonic()
        graph = encoder_graph(model_dir / "model.bin")
        self._sessions: queue.SimpleQueue[onnxruntime.InferenceSession] = queue.SimpleQueue()
        for _ in range(copies):
            self._sessions.put(_session(graph, threads))
        first = self._sessions.get()
        self.mel_bins = int(first.get_inputs()[0].shape[1])  # features [B, mel bins, F]
        self._sessions.put(first)
        log.info(
            "onnx whisper encoder built",
            extra={"copies": copies, "seconds": round(time.monotonic() - started, 2)},
        )

    def encode(self, features: np.ndarray) -> np.ndarray:
        """``features`` [batch, mel bins, frames] (an even count, at most
        3000) -> [batch, frames / 2, width]."""
        session = self._sessions.get()
        try:
            (encoded,) = session.run(None, {"features": np.ascontiguousarray(features)})
        finally:
            self._sessions.put(session)
        return np.asarray(encoded)
