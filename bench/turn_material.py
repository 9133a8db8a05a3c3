"""What bench/turn_taking.py (and the benches beside it) speak: telephone
prompts of the measurement set, cut at the widest gap between their words
for hesitant turns, and whole ones for finished sentences. The prompts
are Asterisk's (bench/speech_sets.py), never a test's."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from voice_agent.session.endpointing import words_unfinished
from voice_agent.testing.audio_data import levels_db, speech_bounds, words

# ``python bench/<script>.py`` puts bench/ on the path, not the checkout's
# root, which the bench.* imports below are found from.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.speech_sets import Utterance, split_sets

RATE = 16_000


# Prompts whose words before the cut (the widest middle gap) make a whole
# sentence by themselves, labelled by grammar from the aligned words ("The
# leader has left | the conference"): a listener could take the turn there
# too. The rest stop on an unfinished phrase ("Your call cannot | be
# completed as dialed"), the hesitation the targets are about.
STANDS_ALONE = frozenset(
    {"agent-pass", "conf-enteringno", "conf-getchannel", "conf-getpin", "conf-leaderhasleft",
     "conf-onlyperson", "confbridge-begin-glorious-b", "confbridge-begin-leader",
     "confbridge-lock-no-join", "confbridge-only-one", "confbridge-pin", "confbridge-removed",
     "demo-nomatch", "dir-nomore", "entr-num-rmv-blklist", "priv-callpending",
     "privacy-prompt", "queue-thankyou", "vm-forward", "vm-forwardoptions", "vm-leavemsg",
     "vm-newpassword", "vm-next", "vm-opts", "vm-rec-name", "vm-rec-temp", "vm-rec-unv",
     "vm-reenterpassword"}
)  # fmt: skip
CUTS = ("unfinished", "stands alone")


def widest_middle_gap(audio: np.ndarray) -> int | None:
    """Sample index of the start of the widest quiet gap (10 ms windows
    under -35 dB) between 30 % and 70 % of the speech, if one is 40 ms+."""
    levels = levels_db(audio)
    start, end = speech_bounds(audio)
    lo, hi = int(start * 100 + (end - start) * 30), int(start * 100 + (end - start) * 70)
    best, best_len, run = None, 0, 0
    for index in range(lo, hi):
        run = run + 1 if levels[index] < -35.0 else 0
        if run > best_len:
            best, best_len = index - run + 1, run
    return best * RATE // 100 if best is not None and best_len >= 4 else None


def telephone_prompts(which: str) -> list[Utterance]:
    """The Asterisk prompts of 5+ words in the set ``which`` ("tuning" or
    "measurement")."""
    return [
        u
        for u in split_sets()[which]
        if "/" not in u.name
        and u.name[:3] != "mfa"
        and not u.name.startswith("libri")
        and len(words(u.text)) >= 5
    ]


def hesitant_cut(prompt: Utterance) -> int | None:
    """Where a one-sentence prompt is cut for a hesitant turn: its widest
    middle gap (None: not one sentence, or no such gap)."""
    if "." in prompt.text.strip()[:-1]:
        return None
    return widest_middle_gap(prompt.audio)


def material(
    limit: int, finished: int
) -> tuple[list[tuple[str, np.ndarray, np.ndarray]], list[np.ndarray]]:
    """(name, first part, rest) of the hesitant prompts, and finished ones."""
    prompts = telephone_prompts("measurement")
    hesitant = []
    for prompt in prompts:
        gap = hesitant_cut(prompt)
        if gap is not None:
            hesitant.append((prompt.name, prompt.audio[:gap], prompt.audio[gap:]))
    sentences = [p for p in prompts if not template(p)]
    return hesitant[:limit], [p.audio for p in sentences[len(sentences) - finished :]]


def template(prompt: Utterance) -> bool:
    """A prompt recorded to be joined to another, its reference text ending
    where a number or a name goes ("The number I have is", "If this is
    correct, press...", "who introduces themselves as:"): not a finished
    sentence, and read as one that goes on."""
    return words_unfinished(prompt.text)
