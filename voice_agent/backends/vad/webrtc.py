"""webrtcvad: a tiny GMM detector; one instance per session costs nothing."""

from __future__ import annotations

import numpy as np
import webrtcvad

from voice_agent.config.listening import ListeningSettings

SAMPLE_RATE = 16_000


class WebRtcVadStream:
    def __init__(self, aggressiveness: int) -> None:
        self._vad = webrtcvad.Vad(aggressiveness)

    def speech_probability(self, frame: np.ndarray) -> float:
        return 1.0 if self._vad.is_speech(frame.tobytes(), SAMPLE_RATE) else 0.0


class WebRtcVad:
    name = "webrtc"

    def __init__(self, aggressiveness: int) -> None:
        self.aggressiveness = aggressiveness

    def new_stream(self) -> WebRtcVadStream:
        return WebRtcVadStream(self.aggressiveness)


def create(settings: ListeningSettings) -> WebRtcVad:
    return WebRtcVad(settings.vad_aggressiveness)
