"""The input audio buffer, for clients that send their audio as events:
``input_audio_buffer.append`` (base64 PCM16, mono, 24 kHz: OpenAI's default
input format), ``.commit`` and ``.clear``.

Appended audio enters the session exactly as media-track audio does,
resampled (statefully, across appends) to the 16 kHz the models take. Once a
client appends audio its media track is no longer listened to.

Appending is paced: a client may send a backlog or a recording faster than
real time, but not without end. The VAD runs on every frame on the event
loop all sessions share, and every turn it ends costs an STT decode, so one
client sending a thousand times real time would stall every other call.
Beyond ``APPEND_BURST_S`` ahead of ``MAX_APPEND_SPEED`` times real time,
appended audio is dropped and the client is told (``rate_limited``, at
most once a second: an error per chunk would feed the flood).
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from voice_agent.audio.resample import StreamResampler
from voice_agent.ratelimit import TokenBucket
from voice_agent.realtime.errors import ClientEventError, error_event
from voice_agent.session.input import MIN_COMMIT_MS
from voice_agent.session.session import VoiceSession
from voice_agent.stages.turns import SAMPLE_RATE

JsonDict = dict[str, Any]
INPUT_RATE = 24_000
# A caller speaks in real time; a client may catch up on a backlog or send
# a recording, at up to this many times real time once its burst is spent.
MAX_APPEND_SPEED = 4.0
APPEND_BURST_S = 20.0


class InputAudioEvents:
    def __init__(self, session: VoiceSession, send: Callable[[JsonDict], None]) -> None:
        self.session = session
        self._send = send
        self._resampler = StreamResampler(INPUT_RATE, SAMPLE_RATE)
        self._pace = TokenBucket(MAX_APPEND_SPEED, APPEND_BURST_S)  # in seconds of audio
        self.dropped_ms = 0  # appended audio refused for its pace
        self._dropped_told = 0.0

    def handlers(self) -> dict[str, Callable[[JsonDict], None]]:
        return {
            "input_audio_buffer.append": self.append,
            "input_audio_buffer.commit": self.commit,
            "input_audio_buffer.clear": self.clear,
        }

    def append(self, event: JsonDict) -> None:
        audio = event.get("audio")
        if not isinstance(audio, str):
            raise ClientEventError("invalid_type", "audio must be a base64 string", "audio")
        try:
            raw = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise ClientEventError("invalid_value", "audio is not valid base64", "audio") from None
        if len(raw) % 2:
            raise ClientEventError(
                "invalid_value", "audio must be whole 16-bit samples (PCM16)", "audio"
            )
        if self._pace.take(len(raw) / 2 / INPUT_RATE) is not None:
            self._drop(len(raw) * 1000 // (2 * INPUT_RATE), event.get("event_id"))
            return
        samples = np.frombuffer(raw, dtype="<i2").astype(np.int16)
        self.session.push_audio(self._resampler.process(samples), from_track=False)

    def _drop(self, ms: int, event_id: object) -> None:
        self.dropped_ms += ms
        now = time.monotonic()
        if now - self._dropped_told < 1.0:
            return
        self._dropped_told = now
        self._send(
            error_event(
                "invalid_request_error",
                "rate_limited",
                f"audio appended faster than {MAX_APPEND_SPEED:g}x real time "
                f"(after a {APPEND_BURST_S:g} s allowance): {self.dropped_ms} ms of it "
                "dropped so far",
                "audio",
                event_id if isinstance(event_id, str) else None,
            )
        )

    def commit(self, event: JsonDict) -> None:
        # What the resampler still holds belongs to this turn.
        tail = self._resampler.process(np.zeros(0, dtype=np.int16), last=True)
        if tail.size:
            self.session.push_audio(tail, from_track=False)
        if self.session.commit_input() is None:
            raise ClientEventError(
                "input_audio_buffer_commit_empty",
                "Error committing input audio buffer: buffer too small. Expected at least "
                f"{MIN_COMMIT_MS}ms of audio (with turn detection on: a turn in progress).",
            )

    def clear(self, event: JsonDict) -> None:
        self._resampler.reset()
        self.session.clear_input()
        self._send({"type": "input_audio_buffer.cleared"})
