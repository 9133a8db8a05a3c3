"""Client events the tests send, built as an OpenAI Realtime client builds them."""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from voice_agent.audio.resample import StreamResampler

Json = dict[str, Any]
EVENT_AUDIO_RATE = 24_000  # OpenAI's default input format: PCM16, mono, 24 kHz


def typed(text: str) -> Json:
    """A typed user message."""
    return {
        "type": "conversation.item.create",
        "item": {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        },
    }


def appended_audio(samples: np.ndarray, rate: int = 16_000, chunk_ms: int = 100) -> list[Json]:
    """``input_audio_buffer.append`` events carrying ``samples`` (mono int16
    at ``rate``) as base64 PCM16 at 24 kHz, ``chunk_ms`` per event."""
    pcm = StreamResampler(rate, EVENT_AUDIO_RATE).process(samples, last=True)
    step = EVENT_AUDIO_RATE * chunk_ms // 1000
    return [
        {
            "type": "input_audio_buffer.append",
            "audio": base64.b64encode(pcm[start : start + step].astype("<i2").tobytes()).decode(),
        }
        for start in range(0, len(pcm), step)
    ]
