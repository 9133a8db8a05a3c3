"""Semantic end of turn: at each pause an end-of-turn model judges whether
the caller is done, so a finished sentence is answered after a short pause
and "my number is ... five five five" is not cut at the dots.

The model hears how the speech stopped, not what was said, and a clause
that ends in a falling tone can sound finished ("please enter the number
... to be blocked"). So a "complete" waits for the pause's early transcript
(the reply already waits for it, so this costs no time) and is overruled
when the words end on one that no sentence ends on ("my number is",
"the", "and", a trailing comma): the turn goes on until the silence cap or
the caller's next pause. The words can only delay an end, never hasten it.

A judgement not back within the timeout is logged and counted as late, and
still awaited: on a loaded host the model's word a little late is better
than the fixed silence, which cuts every hesitant caller, and the silence
cap ends the turn if the word never comes. A judgement that fails is no
judgement: the session falls back to the fixed silence for the rest of the
turn (logged and counted). Either way a turn is never left stuck.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from voice_agent.backends.base import TurnBackend, WordsBackend
from voice_agent.backends.runtime.durations import Durations
from voice_agent.session.input import SemanticTurn
from voice_agent.session.metrics import Decision, Verdict, now
from voice_agent.stages.turns import EndCandidate

log = logging.getLogger(__name__)

# semantic_vad's eagerness, as OpenAI documents it: "low" lets the caller
# take their time (a surer model verdict needed, the longest silence cap),
# "high" ends turns soonest; "auto" is "medium".
EAGERNESS: dict[str, SemanticTurn] = {
    "low": SemanticTurn(threshold=0.7, cap_ms=3000, split_cap_ms=2000),
    "medium": SemanticTurn(threshold=0.5, cap_ms=2000, split_cap_ms=1200),
    "auto": SemanticTurn(threshold=0.5, cap_ms=2000, split_cap_ms=1200),
    "high": SemanticTurn(threshold=0.35, cap_ms=1200, split_cap_ms=800),
}
SERVER_EAGERNESS = "auto"  # semantic turns when the client has not chosen

# English words a sentence does not end on (articles, conjunctions,
# prepositions, possessives, the copula, fillers): a pause after one is
# the caller thinking, whatever the intonation says. Words that often end
# a sentence ("in", "on", "up", "you", "so", "that") are left out.
DANGLING_WORDS = frozenset(
    {"a", "an", "the", "and", "or", "but", "nor", "because", "if", "than", "whether",
     "to", "of", "for", "with", "from", "by", "into", "onto", "at", "as", "my", "your",
     "our", "their", "its", "is", "are", "am", "be", "i", "i'm", "um", "uh", "er", "erm",
     "uhm"}
)  # fmt: skip
TRAILING_MARKS = (",", "...", "\u2026", "-", "\u2014", ":")

# An "incomplete" verdict whose words read as a sentence's end with at
# least this probability (backends/turn/words.py) ends the pause after the
# split cap: on the tuning set, 24 of 29 whole prompts scored over it and 9
# of the 29 words before a pause in their middle (mostly clauses that
# stand alone). A reading not back within WORDS_TIMEOUT_S counts as none.
WORDS_LIKELY = 0.15
# A "complete" the model is less sure of than VOICE_SURE is read by the
# words judge too, and held to the split cap when its words read as a
# sentence's end with less than WORDS_UNLIKELY ("letters of your party's",
# "the conference", "your path": the voice fell, the sentence has no verb
# yet). Set on the tuning set (bench/end_of_turn_offline.py --set tuning):
# cuts ended at the pause 13 -> 6 of 29, whole prompts held 9 -> 10 of 59.
# A surer "complete" is not read: most finished turns are over 0.95, and
# each reading shares the LLM with the reply being prepared.
VOICE_SURE = 0.95
WORDS_UNLIKELY = 0.05
# How long an unsure "complete" waits for that reading: its reply is not
# ready before about 200 ms after the verdict anyway (the STT, the LLM's
# first words, the TTS), so a reading back sooner costs the caller
# nothing; one later is dropped and the voice decides.
COMPLETE_WORDS_TIMEOUT_S = 0.15
WORDS_TIMEOUT_S = 0.3


def words_unfinished(text: str) -> bool:
    """Whether a transcript stops where no sentence stops: on a dangling
    word or a mark that says more is coming."""
    said = text.strip()
    if not said or said.endswith(("?", "!")):  # "Where are you from?" is done
        return False
    if said.endswith(TRAILING_MARKS):
        return True
    last = re.sub(r"[^a-z']", "", said.split()[-1].lower().replace("\u2019", "'"))
    return last in DANGLING_WORDS


@dataclass
class JudgeStats:
    """Every session's judgements in this process (/v1/stats): verdicts by
    decision, how many missed the timeout ("late", also counted by the
    verdict they came back with), and the time answered ones took (asked to
    answered, queue included; failed ones are left out)."""

    decisions: Counter[str] = field(default_factory=Counter)
    inference: Durations = field(default_factory=Durations)
    words: Durations = field(default_factory=Durations)  # the words judge's answers
    # Whether this process's last reading came back within
    # COMPLETE_WORDS_TIMEOUT_S: while the LLM is too busy for that, unsure
    # "complete"s are not read (the reading would add to what slows every
    # reply, and come too late to count).
    words_quick: bool = True

    def snapshot(self) -> dict[str, object]:
        return {
            "decisions": dict(self.decisions),
            "inference": self.inference.summary_ms(),
            "words": self.words.summary_ms(),
        }


class EndOfTurnJudge:
    """One session's judge: at most one judgement in flight, the latest
    pause's (the model's, then the words judge's)."""

    def __init__(
        self,
        model: TurnBackend,
        stats: JudgeStats,
        session_id: str,
        timeout_s: float,
        words: WordsBackend | None = None,
    ) -> None:
        self._model = model
        self.words = words
        self._stats = stats
        self._session_id = session_id
        self._timeout_s = timeout_s
        self._task: asyncio.Task[None] | None = None

    @property
    def semantic(self) -> bool:
        return self._model.semantic

    @property
    def words_quick(self) -> bool:
        """The words judge answers quickly enough to read a "complete" by."""
        return self.words is not None and self._stats.words_quick

    def overruled(self) -> None:
        """A "complete" the words overruled (counted beside the verdicts)."""
        self._stats.decisions["unfinished"] += 1

    def count(self, outcome: str) -> None:
        """What the words judge changed ("words_hastened", "words_held")."""
        self._stats.decisions[outcome] += 1

    def read_words(
        self,
        text: str,
        decided: Callable[[float | None], None],
        timeout_s: float = WORDS_TIMEOUT_S,
    ) -> None:
        """Ask the words judge how likely a sentence ends after ``text``;
        ``decided`` gets the probability (None: failed, or not back within
        ``timeout_s``) unless the caller speaks again first."""
        assert self.words is not None
        self.cancel()
        self._task = asyncio.create_task(
            self._read_words(self.words, text, decided, timeout_s),
            name=f"eot-words-{self._session_id}",
        )

    async def _read_words(
        self,
        words: WordsBackend,
        text: str,
        decided: Callable[[float | None], None],
        timeout_s: float,
    ) -> None:
        asked = now()
        probability: float | None = None
        try:
            probability = await asyncio.wait_for(words.completion(text), timeout_s)
        except asyncio.CancelledError:
            raise
        except TimeoutError:  # a busy LLM server: expected under load, not a fault
            self._stats.decisions["words_late"] += 1
            self._stats.words_quick = False
            log.info(
                "end-of-turn words judge late; the voice decides",
                extra={"session": self._session_id, "timeout_ms": round(timeout_s * 1000)},
            )
        except Exception as exc:  # the server failed: the voice decides
            self._stats.decisions["words_failed"] += 1
            self._stats.words_quick = False
            log.warning(
                "end-of-turn words judge failed; the voice decides",
                extra={"session": self._session_id, "error": repr(exc)},
            )
        else:
            took = now() - asked
            self._stats.words.add(took)
            self._stats.words_quick = took <= COMPLETE_WORDS_TIMEOUT_S
        if self._task is asyncio.current_task():
            self._task = None
        decided(probability)

    def judge(
        self, candidate: EndCandidate, semantic: SemanticTurn, decided: Callable[[Verdict], None]
    ) -> None:
        """Ask about this pause; ``decided`` gets the verdict unless the
        judgement is cancelled first (the caller spoke again)."""
        self.cancel()
        self._task = asyncio.create_task(
            self._judged(candidate, semantic, decided), name=f"eot-{self._session_id}"
        )

    def cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _judged(
        self, candidate: EndCandidate, semantic: SemanticTurn, decided: Callable[[Verdict], None]
    ) -> None:
        asked = now()
        probability: float | None = None
        decision: Decision
        answer = asyncio.ensure_future(self._model.completion(candidate.audio))
        try:
            try:
                probability = await asyncio.wait_for(asyncio.shield(answer), self._timeout_s)
            except TimeoutError:
                self._stats.decisions["late"] += 1
                log.warning(
                    "end-of-turn model late; its verdict is still awaited",
                    extra={"session": self._session_id, "waited_ms": self._timeout_s * 1000},
                )
                probability = await answer
        except asyncio.CancelledError:
            answer.cancel()  # the caller spoke again: this pause needs no verdict
            raise
        except Exception as exc:  # the silence decides instead
            log.warning(
                "end-of-turn model failed; the silence decides",
                extra={"session": self._session_id, "error": repr(exc)},
            )
            decision = "failed"
        else:
            decision = "complete" if probability >= semantic.threshold else "incomplete"
        inference_ms = round((now() - asked) * 1000.0, 1)
        self._stats.decisions[decision] += 1
        if probability is not None:
            self._stats.inference.add(inference_ms / 1000.0)
        if self._task is asyncio.current_task():
            self._task = None
        decided(Verdict(decision, probability, inference_ms, candidate.silence_ms))
