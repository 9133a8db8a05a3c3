"""The words' end of turn: the embedded LLM (SmolLM2-135M, the real one)
reading how likely a sentence ends where a caller's words stop, and the
session acting where the voice and the words disagree: Smart Turn's
"incomplete" on a whole sentence, or its unsure "complete" on words no
sentence ends with. The pause then ends the turn after the split cap
(1.2 s at medium eagerness), not the 2 s cap, nor at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from tests.test_end_of_turn import FINISHED, Listener
from voice_agent.backends.turn.words import plain_words
from voice_agent.engine import Engine
from voice_agent.session.endpointing import (
    COMPLETE_WORDS_TIMEOUT_S,
    EAGERNESS,
    VOICE_SURE,
    WORDS_LIKELY,
    WORDS_TIMEOUT_S,
    WORDS_UNLIKELY,
)
from voice_agent.session.events import UserTurnCommitted
from voice_agent.testing.audio_data import silence
from voice_agent.testing.waiting import until

SENTENCE = np.concatenate((FINISHED, silence(0.3)))  # then a pause the model judges
SPLIT_CAP_S = EAGERNESS["auto"].split_cap_ms / 1000  # 1.2 s
CAP_S = EAGERNESS["auto"].cap_ms / 1000  # 2 s


async def test_the_embedded_llm_reads_where_a_sentence_ends(engine: Engine) -> None:
    assert engine.models is not None and engine.models.words is not None
    words = engine.models.words
    for whole, cut in [
        ("Please check the number and dial again.", "Please check."),
        ("The conference is now muted.", "The conference."),
        ("Your call cannot be completed as dialed.", "Your call cannot"),
    ]:
        # Whisper's own full stop after "Please check." is not what is read.
        assert await words.completion(whole) >= WORDS_LIKELY, whole
        assert await words.completion(cut) < 0.035, cut
    assert await words.completion(" ... ") == 0.0  # no words: nothing asked
    assert plain_words("Your pass-words, please!") == "your pass words please"


class ScriptedWords:
    """A words judge answering what the test says: the session's handling
    of agreement and disagreement is what is tested (the real judge's
    answers are, above)."""

    name = "scripted-words"

    def __init__(self, probability: float | None) -> None:
        self.probability = probability  # None: it fails
        self.delay_s = 0.0  # how long it takes to answer
        self.asked: list[str] = []

    async def completion(self, text: str) -> float:
        self.asked.append(text)
        await asyncio.sleep(self.delay_s)
        if self.probability is None:
            raise ConnectionError("the LLM server went away")
        return self.probability

    async def close(self) -> None:
        pass


@pytest.fixture
async def words() -> ScriptedWords:
    return ScriptedWords(0.4)


@pytest.fixture
async def reader(engine: Engine, words: ScriptedWords) -> AsyncIterator[Listener]:
    engine.end_of_turn.words_quick = True  # as in a fresh process: no reading was late yet
    listener = Listener(engine, words)
    yield listener
    await listener.session.close()


async def judged(listener: Listener, audio: np.ndarray, voice: float) -> None:
    """Speak ``audio`` (ending in a pause); the model's verdict on that
    pause (p = ``voice``) and the words judge's on its words, both applied."""
    listener.model.probability = voice
    await listener.say(audio)
    await listener.release()
    await listener.words_heard()
    judge = listener.session._judge
    assert judge is not None
    await until(lambda: judge._task is None)


def committed(listener: Listener) -> list[UserTurnCommitted]:
    return listener.ended()


async def test_a_sentence_the_voice_kept_up_ends_at_the_split_cap(
    engine: Engine, reader: Listener, words: ScriptedWords
) -> None:
    hastened = engine.end_of_turn.decisions["words_hastened"]
    # Incomplete, says the voice; a sentence, say the words (0.4).
    await judged(reader, SENTENCE, voice=0.05)
    assert words.asked and "dial" in words.asked[-1].lower()
    await reader.say(silence(SPLIT_CAP_S - 0.3 - 0.1))
    assert committed(reader) == []
    await reader.say(silence(0.2))
    assert len(committed(reader)) == 1  # at 1.2 s, not the 2 s cap
    assert engine.end_of_turn.decisions["words_hastened"] == hastened + 1


async def test_a_sure_complete_verdict_is_not_held_for_the_words(
    reader: Listener, words: ScriptedWords
) -> None:
    words.probability = 0.001  # were it asked: they stop mid-phrase
    await judged(reader, SENTENCE, voice=VOICE_SURE + 0.04)
    assert len(committed(reader)) == 1  # the voice's sure "complete" ends it at once
    assert words.asked == []  # most finished sentences wait on no extra request


async def test_an_unsure_complete_on_words_no_sentence_ends_with_waits_the_split_cap(
    engine: Engine, reader: Listener, words: ScriptedWords
) -> None:
    held = engine.end_of_turn.decisions["words_held"]
    words.probability = WORDS_UNLIKELY / 2  # "letters of your party's |"
    await judged(reader, SENTENCE, voice=0.8)
    assert words.asked and "dial" in words.asked[-1].lower()
    assert committed(reader) == []  # not at once
    verdict = reader.session._verdict  # what the turn's latency record will say
    assert verdict is not None and verdict.decision == "unfinished"
    assert verdict.words_probability == WORDS_UNLIKELY / 2
    assert engine.end_of_turn.decisions["words_held"] == held + 1
    await reader.say(silence(SPLIT_CAP_S - 0.3 - 0.1))
    assert committed(reader) == []
    await reader.say(silence(0.2))
    assert len(committed(reader)) == 1  # at 1.2 s, not the 2 s cap


@pytest.mark.parametrize("probability", [WORDS_UNLIKELY, 0.4, None])
async def test_an_unsure_complete_on_words_that_may_end_ends_at_once(
    reader: Listener, words: ScriptedWords, probability: float | None
) -> None:
    words.probability = probability  # may end there, or no answer (None): the voice decides
    await judged(reader, SENTENCE, voice=0.8)
    assert words.asked
    assert len(committed(reader)) == 1


async def test_voice_and_words_that_both_hear_more_wait_the_cap(
    reader: Listener, words: ScriptedWords
) -> None:
    words.probability = 0.05
    await judged(reader, SENTENCE, voice=0.05)
    assert words.asked  # read, and the words too say the caller goes on
    await reader.say(silence(CAP_S - 0.3 - 0.2))
    assert committed(reader) == []  # 1.8 s: the 2 s cap stands
    await reader.say(silence(0.3))
    assert len(committed(reader)) == 1


async def test_the_split_cap_lapses_when_the_caller_speaks_again(
    reader: Listener, words: ScriptedWords
) -> None:
    await judged(reader, SENTENCE, voice=0.05)  # the split cap, for this pause
    await reader.say(FINISHED)  # they go on before it runs out
    words.probability = 0.05
    await judged(reader, silence(0.3), voice=0.05)
    await reader.say(silence(CAP_S - 0.3 - 0.2))
    assert committed(reader) == []  # the lapsed 1.2 s does not end this pause
    await reader.say(silence(0.3))
    assert len(committed(reader)) == 1


async def test_a_failing_words_judge_leaves_the_verdict_to_the_voice(
    engine: Engine, reader: Listener, words: ScriptedWords
) -> None:
    failed = engine.end_of_turn.decisions["words_failed"]
    words.probability = None
    await judged(reader, SENTENCE, voice=0.05)
    assert engine.end_of_turn.decisions["words_failed"] == failed + 1
    await reader.say(silence(CAP_S - 0.3 - 0.2))
    assert committed(reader) == []  # "incomplete" stands: the 2 s cap
    await reader.say(silence(0.3))
    assert len(committed(reader)) == 1


async def test_an_unsure_complete_waits_only_briefly_for_the_words(
    engine: Engine, reader: Listener, words: ScriptedWords
) -> None:
    late = engine.end_of_turn.decisions["words_late"]
    failed = engine.end_of_turn.decisions["words_failed"]
    words.probability = WORDS_UNLIKELY / 2  # would hold it, were it in time
    # A loaded LLM server: later than an unsure "complete" waits, in time
    # for an "incomplete"'s reading.
    words.delay_s = (COMPLETE_WORDS_TIMEOUT_S + WORDS_TIMEOUT_S) / 2
    await judged(reader, SENTENCE, voice=0.8)
    assert len(committed(reader)) == 1  # the voice decided when the reading was late
    # Counted as late, not as a failure: a busy LLM server is not a fault.
    assert engine.end_of_turn.decisions["words_late"] == late + 1
    assert engine.end_of_turn.decisions["words_failed"] == failed
    # While the LLM is that slow, unsure "complete"s are not read at all...
    words.delay_s = 0.0
    asked = len(words.asked)
    await judged(reader, SENTENCE, voice=0.8)
    assert len(committed(reader)) == 2 and len(words.asked) == asked
    # ...until a reading (an "incomplete"'s) comes back in time again.
    words.probability = 0.05
    await judged(reader, SENTENCE, voice=0.05)
    assert len(words.asked) == asked + 1 and engine.end_of_turn.words_quick
