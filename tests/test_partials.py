"""Which words of successive hypotheses become transcription deltas.

The recogniser here is scripted (a queue of hypotheses the test releases one
at a time): what is under test is the session's delta policy and its
lifecycle, not a model (test_parakeet.py runs a real one)."""

from __future__ import annotations

import asyncio

import numpy as np

from voice_agent.session.events import SessionEvent, UserTranscriptDelta
from voice_agent.session.partials import PartialTranscripts


class ScriptedRecogniser:
    default_partial_interval_ms = 500

    def __init__(self) -> None:
        self.requests: list[int] = []  # samples in each request
        self.answers: asyncio.Queue[str | None] = asyncio.Queue()

    async def transcribe_partial(self, audio: np.ndarray) -> str | None:
        self.requests.append(len(audio))
        return await self.answers.get()


def deltas(events: list[SessionEvent]) -> list[str]:
    return [e.delta for e in events if isinstance(e, UserTranscriptDelta)]


async def feed(partials: PartialTranscripts, item: str, turn_ms: int) -> None:
    partials.on_audio(item, turn_ms, lambda: np.zeros(turn_ms * 16, dtype=np.int16))
    # One step: a request this started (a task made ready before this one
    # resumes) records its audio and waits for its answer.
    await asyncio.sleep(0)


async def ended(task: asyncio.Task[str | None] | None) -> None:
    """Wait until the request ``task`` has ended and the session has handled
    its end: the session's done-callback was added first, so it has run by
    the time this wait's own one does."""
    assert task is not None, "no request in flight"
    done, _ = await asyncio.wait([task], timeout=10)
    assert done, "the request never ended"


async def answer(partials: PartialTranscripts, stt: ScriptedRecogniser, text: str | None) -> None:
    """Answer the request in flight with ``text``; returns once the session has taken it."""
    task = partials._task
    await stt.answers.put(text)
    await ended(task)


async def test_only_words_two_hypotheses_agree_on_are_sent_append_only() -> None:
    stt, events = ScriptedRecogniser(), list[SessionEvent]()
    partials = PartialTranscripts(stt, 500, events.append, "sess")
    hypotheses = [
        "he ws n",  # nothing to agree with yet
        "he was not",  # agrees on "he"
        "he was not an",  # "was not" settle
        "he was knot an il",  # revises a sent word: nothing sent
        "he was not an ill dis",  # agrees with the revision only on "he was"
        "he was not an ill disposed",  # "an ill" agreed, "disposed" is the last
    ]
    for index, text in enumerate(hypotheses):
        await feed(partials, "item_1", 500 * (index + 1))
        await feed(partials, "item_1", 500 * (index + 1) + 20)  # one in flight at most
        await answer(partials, stt, text)
    assert deltas(events) == ["he", " was not", " an ill"]
    assert stt.requests == [8000 * (i + 1) for i in range(len(hypotheses))]
    assert all(isinstance(e, UserTranscriptDelta) and e.item_id == "item_1" for e in events)


async def test_nothing_is_sent_after_the_turn_ends_or_when_skipped() -> None:
    stt, events = ScriptedRecogniser(), list[SessionEvent]()
    partials = PartialTranscripts(stt, 500, events.append, "sess")
    await feed(partials, "item_1", 500)
    await answer(partials, stt, None)  # skipped: the model was busy with finals
    await feed(partials, "item_1", 700)  # not yet another interval
    assert len(stt.requests) == 1
    await feed(partials, "item_1", 1000)
    in_flight = partials._task
    partials.stop()  # the turn ends while that request is in flight (cancelled)
    await ended(in_flight)
    assert events == [] and len(stt.requests) == 2
    # A new turn starts from scratch.
    await feed(partials, "item_2", 500)
    await answer(partials, stt, "go forward")
    await feed(partials, "item_2", 1000)
    await answer(partials, stt, "go forward ten")
    assert deltas(events) == ["go forward"]
    assert partials.latency.count == 2
    assert stt.answers.empty()  # every hypothesis was asked for


async def test_a_result_that_lands_as_the_turn_ends_is_dropped() -> None:
    stt, events = ScriptedRecogniser(), list[SessionEvent]()
    partials = PartialTranscripts(stt, 500, events.append, "sess")
    for text in ("go forward", "go forward ten"):
        await feed(partials, "item_1", 500 * (len(stt.requests) + 1))
        await answer(partials, stt, text)
    assert deltas(events) == ["go forward"]
    # The recogniser answers at once: the request has finished, but its
    # done-callback has not run yet when the turn ends.
    stt.answers.put_nowait("go forward ten meters please")
    await feed(partials, "item_1", 1500)
    task = partials._task
    assert task is not None and task.done()
    partials.stop()
    await ended(task)
    assert deltas(events) == ["go forward"]  # " ten" is never sent
    assert partials.latency.count == 2 and len(stt.requests) == 3
    assert stt.answers.empty()


async def test_a_pause_cancels_the_partial_in_flight_and_none_runs_until_speech_resumes() -> None:
    stt, events = ScriptedRecogniser(), list[SessionEvent]()
    partials = PartialTranscripts(stt, 500, events.append, "sess")
    await feed(partials, "item_1", 500)
    task = partials._task
    assert task is not None and not task.done()
    # The user pauses: the speculative transcript covers the turn so far,
    # so this partial is obsolete and its work is given up.
    partials.pause()
    await ended(task)
    assert task.cancelled()
    await feed(partials, "item_1", 1200)  # the pause's silence: no partial of it
    assert len(stt.requests) == 1
    partials.resume()  # the user speaks on
    await feed(partials, "item_1", 1300)
    assert len(stt.requests) == 2 and stt.requests[-1] == 1300 * 16
    await answer(partials, stt, "go forward ten")
    assert partials.latency.count == 1
    # A pause never carries over to the next turn.
    partials.pause()
    await feed(partials, "item_2", 500)
    assert len(stt.requests) == 3
