"""Whisper's encoder on ONNX Runtime (``--stt-encoder onnx``).

Why: CTranslate2 holds the whole model to run either half of it, and it
widens the decoder's 26.5M-entry embedding table to float32 when it loads
int8: Whisper base is 180 MB of CTranslate2's memory, though the decoder
runs on ONNX Runtime (whisper_onnx_decoder.py). The encoder alone as an ONNX
graph with int8 weights is about 22 MB, and no slower: measured on 2 cores
(Intel Xeon), 9.7 / 12.8 / 22.2 / 42.2 ms for 1.5 / 3 / 5 / 8 s windows
against CTranslate2's 12.3 / 15.1 / 29.1 / 49.2 ms.

The graph is built from the packaged model's float16 weights and cached on
disk (whisper_onnx_graphs.py).
"""

from __future__ import annotations

import logging
import queue
import time
from pathlib import Path

import numpy as np
import onnxruntime

from voice_agent.backends.runtime.onnx_options import quiet_session_options, session_from_bytes
from voice_agent.backends.stt.whisper_onnx_graphs import encoder_graph

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
