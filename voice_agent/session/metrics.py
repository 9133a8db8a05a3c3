"""Per-turn latency record: where the time between the user's last word and
the assistant's first sound went."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal


def now() -> float:
    return time.monotonic()


def _ms(later: float | None, earlier: float | None) -> float | None:
    if later is None or earlier is None:
        return None
    return round((later - earlier) * 1000.0, 1)


# An end-of-turn model's answer; "unfinished": it said complete, and the
# words overruled it (they end on a word no sentence ends on).
Decision = Literal["complete", "incomplete", "unfinished", "failed"]
# What ended a user turn: the end-of-turn model's verdict, the silence (the
# fixed one, or the cap after an "incomplete"), the client's commit, or a
# short burst over a reply (ended at its first pause to decide at once).
TurnEndCause = Literal["model", "silence", "commit", "barge_in"]


@dataclass(frozen=True)
class Verdict:
    """An end-of-turn model's judgement of one pause."""

    decision: Decision
    probability: float | None  # None: the model did not answer
    inference_ms: float  # asked to answered (queue and batch included)
    silence_ms: int  # the silence heard when the model was asked
    # P(a sentence ends where the words stop), from a language model; None:
    # not asked (no words judge, no words) or no answer.
    words_probability: float | None = None


@dataclass
class TurnMetrics:
    """Monotonic timestamps (seconds) of one turn's milestones."""

    speech_end: float | None = None  # arrival of the user's last voiced frame
    turn_end: float | None = None  # end of turn decided (silence long enough)
    stt_start: float | None = None
    stt_done: float | None = None
    llm_request: float | None = None
    llm_first_token: float | None = None
    first_piece: float | None = None  # first speakable piece cut from the reply
    tts_start: float | None = None
    tts_first_audio: float | None = None  # first piece synthesised and resampled
    first_frame_sent: float | None = None
    speculative: bool = False  # the reply was prepared before the turn ended
    # The end-of-turn model's last verdict on this turn (None: the silence
    # alone ended it, or no model judged it).
    end_of_turn: Verdict | None = None
    ended_by: TurnEndCause | None = None  # None: no spoken turn (typed text, a greeting)

    def record(self) -> dict[str, float | str | None]:
        """The spans, and how the turn's end was decided."""
        verdict = self.end_of_turn
        return {
            **self.spans(),
            "end_of_turn_decision": self.ended_by,
            "end_of_turn_verdict": verdict.decision if verdict else None,
            "end_of_turn_probability": (
                round(verdict.probability, 3)
                if verdict is not None and verdict.probability is not None
                else None
            ),
            "end_of_turn_inference_ms": verdict.inference_ms if verdict else None,
            "end_of_turn_words_probability": (
                round(verdict.words_probability, 3)
                if verdict is not None and verdict.words_probability is not None
                else None
            ),
        }

    def spans(self) -> dict[str, float | None]:
        """Durations in milliseconds."""
        return {
            "end_of_turn_delay_ms": _ms(self.turn_end, self.speech_end),
            "stt_ms": _ms(self.stt_done, self.stt_start),
            # When STT began: the pause (speculation) or the end of turn.
            "stt_start_after_speech_end_ms": _ms(self.stt_start, self.speech_end),
            "stt_final_after_speech_end_ms": _ms(self.stt_done, self.speech_end),
            "llm_ttft_ms": _ms(self.llm_first_token, self.llm_request),
            "llm_first_token_after_speech_end_ms": _ms(self.llm_first_token, self.speech_end),
            "first_piece_after_speech_end_ms": _ms(self.first_piece, self.speech_end),
            "tts_first_audio_ms": _ms(self.tts_first_audio, self.tts_start),
            "tts_first_audio_after_speech_end_ms": _ms(self.tts_first_audio, self.speech_end),
            "voice_to_voice_ms": _ms(self.first_frame_sent, self.speech_end),
            "server_overhead_ms": self.server_overhead_ms(),
        }

    def server_overhead_ms(self) -> float | None:
        """Time on the critical path spent outside model compute: the hand-offs
        STT -> LLM and LLM piece -> TTS, and from audio ready (or turn end, if
        the audio was ready earlier) to the frame leaving for the network."""
        if None in (
            self.stt_done,
            self.llm_request,
            self.first_piece,
            self.tts_start,
            self.tts_first_audio,
            self.turn_end,
            self.first_frame_sent,
        ):
            return None
        assert self.stt_done is not None and self.llm_request is not None
        assert self.first_piece is not None and self.tts_start is not None
        assert self.tts_first_audio is not None and self.turn_end is not None
        assert self.first_frame_sent is not None
        stt_to_llm = max(0.0, self.llm_request - self.stt_done)
        piece_to_tts = max(0.0, self.tts_start - self.first_piece)
        ready = max(self.tts_first_audio, self.turn_end)
        to_wire = max(0.0, self.first_frame_sent - ready)
        return round((stt_to_llm + piece_to_tts + to_wire) * 1000.0, 2)
