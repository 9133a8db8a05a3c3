"""Live partial transcripts of the user's turn while they are still speaking.

Every ``interval_ms`` of new turn audio the turn so far is transcribed at low
priority, at most one request in flight per session; the model skips it when
it is busy with final transcripts (or the turn is longer than it transcribes
partially), so partials delay finals by at most one small partial batch.

OpenAI's transcription deltas are append-only text, while a recogniser's
hypothesis for speech in progress gets revised (the last word especially is
often cut). So only settled words are sent: those two consecutive
hypotheses agree on (local agreement), never the last word of the newest, and
only while the words already sent are still their prefix. A revision of words
already sent is not retracted; the ``...completed`` event that follows
carries the authoritative transcript.

``on_words`` (the LLM prefill of the words so far) is told every newest
hypothesis but its last word: unlike a delta, a prefill may be revised at no
cost but its few tokens, and it caches more when it does not wait for words
to settle.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import numpy as np

from voice_agent.backends.capabilities import PartialTranscriber
from voice_agent.backends.runtime.durations import Durations
from voice_agent.session.events import SessionEvent, UserTranscriptDelta

log = logging.getLogger(__name__)


class PartialTranscripts:
    def __init__(
        self,
        stt: PartialTranscriber,
        interval_ms: int,
        emit: Callable[[SessionEvent], None],
        session_id: str,
        on_words: Callable[[str], None] | None = None,
    ) -> None:
        self._stt = stt
        self._interval_ms = interval_ms
        self._emit = emit
        self._session_id = session_id
        self._on_words = on_words
        self._item_id: str | None = None
        self._sent: list[str] = []
        self._previous: list[str] = []  # the last hypothesis, in words
        self._requested_at_ms = 0
        self._task: asyncio.Task[str | None] | None = None
        self._paused = False
        self.latency = Durations()

    def on_audio(self, item_id: str, turn_ms: int, audio: Callable[[], np.ndarray]) -> None:
        """Called as turn audio arrives; ``audio`` gives the turn so far."""
        if item_id != self._item_id:
            self.stop()
            self._item_id, self._sent, self._previous = item_id, [], []
            self._requested_at_ms = 0
            self._paused = False
        if (
            self._paused
            or self._task is not None
            or turn_ms - self._requested_at_ms < self._interval_ms
        ):
            return
        self._requested_at_ms = turn_ms
        started = time.monotonic()
        task = asyncio.create_task(self._stt.transcribe_partial(audio()), name="stt-partial")
        self._task = task
        task.add_done_callback(lambda t: self._on_result(item_id, t, started))

    def _on_result(self, item_id: str, task: asyncio.Task[str | None], started: float) -> None:
        if self._task is task:
            self._task = None
        if task.cancelled():
            return
        if task.exception() is not None:
            log.debug(
                "partial failed", exc_info=task.exception(), extra={"session": self._session_id}
            )
            return
        text = task.result()
        if text is None or item_id != self._item_id:
            return  # skipped (model busy with finals) or a stale turn
        self.latency.add(time.monotonic() - started)
        words = text.split()
        if self._on_words is not None and len(words) > 1:
            self._on_words(" ".join(words[:-1]))  # the last word is often cut
        settled = _common_prefix(self._previous, words[:-1])
        self._previous = words
        if len(settled) <= len(self._sent) or settled[: len(self._sent)] != self._sent:
            return
        new = settled[len(self._sent) :]
        self._emit(UserTranscriptDelta(item_id, (" " if self._sent else "") + " ".join(new)))
        self._sent = settled

    def pause(self) -> None:
        """The user paused: the turn so far is being transcribed for the
        speculative reply, so a partial of it is obsolete. The one in flight
        is cancelled (a model that can skips the rest of its work) and none
        starts until speech resumes."""
        self._paused = True
        if self._task is not None:
            self._task.cancel()
            self._task = None

    def resume(self) -> None:
        self._paused = False

    def stop(self) -> None:
        """The turn ended (or the session closes): nothing more for it."""
        self._item_id = None
        if self._task is not None:
            self._task.cancel()
            self._task = None


def _common_prefix(a: list[str], b: list[str]) -> list[str]:
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return a[:count]
