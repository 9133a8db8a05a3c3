"""The ``silence`` turn backend: no model; a fixed silence ends every turn
(``--turn-silence-ms``, or semantic_vad's eagerness as a silence)."""

from __future__ import annotations

import numpy as np

from voice_agent.config.listening import ListeningSettings


class SilenceTurn:
    name = "silence"
    semantic = False

    async def completion(self, audio: np.ndarray) -> float:
        raise NotImplementedError("the silence backend judges nothing: the silence decides")

    def close(self) -> None:
        pass


def create(settings: ListeningSettings) -> SilenceTurn:
    return SilenceTurn()
