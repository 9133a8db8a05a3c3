"""Process-wide Prometheus metrics of what the sessions do: replies by
outcome, per-stage turn latency, LLM and speech failures by code.

The transports (``rtc/call.py``, ``ws/call.py``) hand every session event
to ``observe``; the server exposes the result at ``GET /metrics``
(``server/metrics.py``), with the live state (calls, pacing, STT batches)
read at scrape time. Histograms are in seconds, as Prometheus prefers.
"""

from __future__ import annotations

from prometheus_client import Counter, Histogram

from voice_agent.session.events import ResponseFinished, SessionError, SessionEvent

# Stage name -> the TurnMetrics span it is read from.
STAGES = {
    "end_of_turn": "end_of_turn_delay_ms",
    "stt": "stt_ms",
    "llm_ttft": "llm_ttft_ms",
    "tts_first_audio": "tts_first_audio_ms",
    "voice_to_voice": "voice_to_voice_ms",
}
BUCKETS_S = (0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)

RESPONSES = Counter(
    "voice_agent_responses", "Replies finished, by status and reason.", ["status", "reason"]
)
TURN_LATENCY = Histogram(
    "voice_agent_turn_latency_seconds",
    "Per-turn latency by stage (voice_to_voice: end of speech to the first frame sent).",
    ["stage"],
    buckets=BUCKETS_S,
)
END_OF_TURN = Counter(
    "voice_agent_end_of_turn",
    "Answered turns by what ended them (model: its verdict; silence: the silence ran out; "
    "commit: the client; barge_in: a short burst over a reply) and the end-of-turn "
    "model's verdict on the last pause (none: it did not judge).",
    ["decision", "verdict"],
)
END_OF_TURN_INFERENCE = Histogram(
    "voice_agent_end_of_turn_inference_seconds",
    "End-of-turn model: asked to answered, queue included (answered turns' last verdict).",
    buckets=(0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0),
)
END_OF_TURN_PROBABILITY = Histogram(
    "voice_agent_end_of_turn_probability",
    "End-of-turn model: probability that the turn was complete (answered turns' last verdict).",
    buckets=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
)
END_OF_TURN_WORDS = Histogram(
    "voice_agent_end_of_turn_words_probability",
    "End-of-turn words judge: probability that a sentence ends where the words stopped "
    "(answered turns' last verdict, where the words were read).",
    buckets=(0.01, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1.0),
)
ERRORS = Counter(
    "voice_agent_session_errors", "Errors told to callers (LLM, STT, TTS), by code.", ["code"]
)


def observe(event: SessionEvent) -> None:
    if isinstance(event, ResponseFinished):
        RESPONSES.labels(event.status, event.reason or "").inc()
        if event.metrics is not None:
            spans = event.metrics.spans()
            for stage, key in STAGES.items():
                value = spans.get(key)
                if value is not None:
                    TURN_LATENCY.labels(stage).observe(value / 1000.0)
            _observe_end_of_turn(event.metrics.record())
    elif isinstance(event, SessionError):
        ERRORS.labels(event.code).inc()


def _observe_end_of_turn(record: dict[str, float | str | None]) -> None:
    if record["end_of_turn_decision"] is None:
        return  # not a spoken turn's reply
    END_OF_TURN.labels(
        str(record["end_of_turn_decision"]), str(record["end_of_turn_verdict"] or "none")
    ).inc()
    inference = record["end_of_turn_inference_ms"]
    if isinstance(inference, float | int):
        END_OF_TURN_INFERENCE.observe(inference / 1000.0)
    probability = record["end_of_turn_probability"]
    if isinstance(probability, float | int):
        END_OF_TURN_PROBABILITY.observe(probability)
    words = record["end_of_turn_words_probability"]
    if isinstance(words, float | int):
        END_OF_TURN_WORDS.observe(words)
