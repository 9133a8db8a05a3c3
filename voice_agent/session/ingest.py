"""The caller's audio into turns: frames through VAD and the turn detector.

Every frame is judged here, synchronously (microseconds a frame), and the
detector's events are handed on: a speech onset starts a user turn (and,
over a reply, barges in), a pause starts a speculation, an end candidate
asks the end-of-turn model, speech resuming drops the speculation, and the
silence ends the turn. With turn detection off (push-to-talk) the audio is
only kept until the client commits or clears it. The detector's settings
are applied here too, as they decide how frames become turns. This is apart
from the façade because it is the session's input path, the one part that
runs on every frame; what each event leads to is in the other parts.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from voice_agent.session.events import UserSpeechStarted, UserTurnCommitted
from voice_agent.session.ids import new_id
from voice_agent.session.input import TurnDetection
from voice_agent.session.metrics import TurnMetrics, now
from voice_agent.session.state import SessionState
from voice_agent.stages.turns import (
    FRAME_SAMPLES,
    SAMPLE_RATE,
    EndCandidate,
    Paused,
    Resumed,
    SpeechStarted,
    TurnEnded,
)


class AudioIngest(SessionState):
    """Audio in, turn events out; turns taken by hand; detector settings."""

    def push_audio(
        self, samples: np.ndarray, from_track: bool = True, echo_may_return: bool = False
    ) -> None:
        """16 kHz mono int16 audio, any length: from the media track, or sent
        by the client as data (``from_track=False``), which silences the track.
        ``echo_may_return``: the call's echo canceller says the agent's own
        echo may be in this audio (session/barge_in.py)."""
        if self._closed or self._ending or (from_track and self._track_muted):
            return
        if not from_track and not self._track_muted:
            self._track_muted = True
            self._pending = np.zeros(0, dtype=np.int16)
        data = np.concatenate((self._pending, samples)) if self._pending.size else samples
        full = len(data) - len(data) % FRAME_SAMPLES
        detection = self.turn_detection
        for start in range(0, full, FRAME_SAMPLES):
            frame = data[start : start + FRAME_SAMPLES]
            probability = self._speech.probability(frame)
            voiced = probability >= self._detector.threshold
            if voiced:
                self._last_voiced_at = now()
                if self._judge is not None:
                    self._judge.cancel()  # the pause it judged is over
            if detection is None:
                self._manual.push(frame, voiced)
                continue
            self._barge_in.frame_heard(voiced, echo_may_return)
            if not self._detector.in_turn:
                replying = detection.interrupt_response and self._replying()
                self._barge_in.onset_frame(voiced and replying)
            for event in self._detector.push(frame, probability):
                self._handle(event)
            if self._detector.in_turn and self._barge_in.heard_enough(self._detector.voiced_ms):
                self._barge_in.confirm("long enough")
        self._pending = data[full:]
        if detection is None:
            return
        if self._partials is not None and self._item_id is not None and self._detector.in_turn:
            self._partials.on_audio(
                self._item_id, self._detector.turn_ms, self._detector.turn_audio
            )

    def _handle(self, event: SpeechStarted | Paused | EndCandidate | Resumed | TurnEnded) -> None:
        if isinstance(event, SpeechStarted):
            self._verdict = None
            self._on_speech_started(event)
        elif isinstance(event, Paused):
            if self._partials is not None:
                self._partials.pause()
            self._start_speculation(event)
        elif isinstance(event, EndCandidate):
            self._ask_judge(event)
        elif isinstance(event, Resumed):
            self._verdict = None  # that pause's
            if self._partials is not None:
                self._partials.resume()
            self._drop_speculation()
        else:
            if self._judge is not None:
                self._judge.cancel()
            self._on_turn_ended(event, "silence")

    def _on_speech_started(self, event: SpeechStarted) -> None:
        self._generation += 1
        self._item_id = new_id("item")
        self._emit(UserSpeechStarted(self._item_id, event.audio_start_ms))
        # Barge-in: the user talks over the assistant (or over a reply still
        # being prepared for their previous turn).
        if self._interrupts() and self._replying():
            assert self._response is not None
            if self.turn_detection is None or not self._barge_in.hold(
                self._response, self._generation
            ):
                self._response.cancel("turn_detected")
        self._drop_speculation()

    def set_turn_detection(self, detection: TurnDetection | None) -> None:
        """Detect turns with these settings, or (None) take them by hand.
        Changing between the two forgets the turn in progress."""
        automatic_before = self.turn_detection is not None
        self.turn_detection = detection
        if (detection is not None) != automatic_before:
            self._abandon_turn()
        if detection is not None:
            self.turn_detection = self._configure_detector(detection)

    def _configure_detector(self, detection: TurnDetection) -> TurnDetection:
        """Set the detector for these settings; semantic ones need a model
        (without one, the fixed silence stands)."""
        if detection.semantic is not None and self._judge is None:
            detection = dataclasses.replace(detection, semantic=None)
        if self._judge is not None:
            self._judge.cancel()  # judged for the settings before
        semantic = detection.semantic
        # With a model, the turn ends when it says so; the cap is the longest wait.
        silence_ms = semantic.cap_ms if semantic is not None else detection.silence_ms
        self._detector.set_silence_ms(silence_ms)
        self._detector.set_judge_ms(self.config.judge_ms if semantic is not None else 0)
        self._silence_ms = silence_ms
        self._detector.threshold = detection.threshold
        self._detector.set_preroll_ms(detection.preroll_ms)
        return detection

    def commit_input(self) -> str | None:
        """End the user's turn now (push-to-talk, or ahead of the detector):
        it is transcribed, and answered if turns are being answered. The new
        item's id, or None when there is no turn to commit."""
        if self._closed:
            return None
        if self.turn_detection is not None:
            item_id = self._item_id
            if self._judge is not None:
                self._judge.cancel()
            ended = self._detector.end_turn()
            if ended is None or item_id is None:
                return None
            self._on_turn_ended(ended, "commit")
            return item_id
        audio = self._manual.take()
        if audio is None:
            return None
        item_id = new_id("item")
        self._emit(UserTurnCommitted(item_id))
        end_ms = len(audio) * 1000 // SAMPLE_RATE
        event = TurnEnded(
            audio=audio,
            audio_start_ms=0,
            audio_end_ms=end_ms,
            silence_ms=0,
            voiced_ms=self._manual.taken_voiced_ms,
        )
        metrics = TurnMetrics(ended_by="commit")
        metrics.turn_end = metrics.speech_end = now()
        self._start_turn(event, item_id, None, metrics, self._generation)
        return item_id

    def clear_input(self) -> None:
        """Forget the user's audio not yet committed."""
        self._manual.clear()
        self._abandon_turn()

    def _abandon_turn(self) -> None:
        self._barge_in.release("turn abandoned")  # nothing will decide it now
        if self._judge is not None:
            self._judge.cancel()
        self._verdict = None
        if self._partials is not None:
            self._partials.stop()
        self._detector.reset()
        self._drop_speculation()
        self._item_id = None
        self._pending = np.zeros(0, dtype=np.int16)
