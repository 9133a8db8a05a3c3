"""Speech probability per 20 ms frame: the VAD backend behind an energy gate.

WebRTC's VAD adapts to the level it hears, so in near-silence (a muted
microphone, digital zeros, a quiet room) it calls noise speech. Frames below
an absolute level floor are treated as silence before the VAD is asked.
"""

from __future__ import annotations

import numpy as np

from voice_agent.audio.pcm import rms_dbfs
from voice_agent.backends.base import VadBackend

DEFAULT_FLOOR_DBFS = -50.0


class SpeechDetector:
    def __init__(self, backend: VadBackend, floor_dbfs: float = DEFAULT_FLOOR_DBFS) -> None:
        self._stream = backend.new_stream()
        self._floor = floor_dbfs

    def probability(self, frame: np.ndarray) -> float:
        if rms_dbfs(frame) < self._floor:
            # Still feed the model: recurrent VADs need continuous context.
            self._stream.speech_probability(frame)
            return 0.0
        return self._stream.speech_probability(frame)
