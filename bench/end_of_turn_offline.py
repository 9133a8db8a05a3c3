"""End of turn offline: the voice's and the words' verdicts on cut prompts,
to set a rule's thresholds on the tuning set and check them on the other.

For each telephone prompt of 5+ words in the chosen set
(bench/speech_sets.py), cut at its widest middle gap as bench/turn_taking.py
cuts its hesitant turns, and for the whole prompt too, it asks what the
session asks at a pause, with the service's own backends:

- Smart Turn (the ``turn`` backend) on the audio so far with 200 ms of
  silence after it (the end candidate);
- Whisper (the ``stt`` backend), speculatively, on the audio so far with
  100 ms of silence (the pause's early transcript);
- the words judge (backends/turn/words.py) on that transcript, from the
  packaged SmolLM2 on a llama-server started here.

Then it prints, for each rule, how many cuts would end the turn at the cut
(the agent talks over a caller who goes on after a 1 s pause) and how many
whole prompts would not end at their first pause (a finished caller
waits). The cuts are split as bench/turn_taking.py splits them: an
unfinished phrase, or a clause that stands alone.

No network, no WebRTC: the audio is the 16 kHz recording, not what Opus
made of it; live figures come from bench/turn_taking.py.

    .venv/bin/python bench/end_of_turn_offline.py --set tuning
    .venv/bin/python bench/end_of_turn_offline.py --set measurement --verbose
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from voice_agent.backends import registry
from voice_agent.backends.base import SttBackend, TurnBackend
from voice_agent.backends.capabilities import CarefulTranscriber
from voice_agent.backends.llm.llama_child import default_model_path
from voice_agent.backends.llm.llama_server import EmbeddedLlamaServer
from voice_agent.backends.llm.weights import weights_for
from voice_agent.backends.turn.words import WordsJudge
from voice_agent.config.settings import load_settings
from voice_agent.session.endpointing import (
    EAGERNESS,
    SERVER_EAGERNESS,
    WORDS_LIKELY,
    words_unfinished,
)
from voice_agent.testing.figures import table

# ``python bench/<script>.py`` puts bench/ on the path, not the checkout's
# root, which the bench.* imports below are found from.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.turn_material import STANDS_ALONE, hesitant_cut, telephone_prompts

RATE = 16_000
JUDGED_AFTER_S = 0.2  # the end candidate's silence
HEARD_AFTER_S = 0.1  # the speculation's


@dataclass
class Heard:
    name: str
    kind: str  # "unfinished", "stands alone" (cuts) or "whole"
    voice: float  # Smart Turn's P(complete)
    text: str
    words: float  # the words judge's P(a sentence ends here)


def quiet(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), dtype=np.int16)


async def hear(
    name: str, kind: str, audio: np.ndarray, turn: TurnBackend, stt: SttBackend, judge: WordsJudge
) -> Heard:
    voice = await turn.completion(np.concatenate((audio, quiet(JUDGED_AFTER_S))))
    sound = np.concatenate((audio, quiet(HEARD_AFTER_S)))
    if isinstance(stt, CarefulTranscriber):
        transcription = await stt.transcribe_detailed(sound, speculative=True)
        text = transcription.text.strip() if transcription is not None else ""
    else:
        text = (await stt.transcribe(sound)).strip()
    return Heard(name, kind, voice, text, await judge.completion(text) if text else 0.0)


def ends(item: Heard, threshold: float, words_floor: float, voice_sure: float) -> bool:
    """Whether the turn ends at this pause under the rule: the voice says
    complete (and the words do not dangle), and, unless the voice is sure,
    the words read as a sentence's end at least ``words_floor``."""
    if item.voice < threshold or words_unfinished(item.text):
        return False
    return item.voice >= voice_sure or item.words >= words_floor


def report(items: list[Heard], threshold: float) -> None:
    kinds = ("unfinished", "stands alone", "whole")
    rules = [("voice and dangling words", 0.0, 2.0)]
    for floor in (0.02, 0.05, 0.1, WORDS_LIKELY):
        for sure in (0.9, 0.95, 2.0):
            label = f"words >= {floor:g}" + (f" unless voice >= {sure:g}" if sure <= 1 else "")
            rules.append((label, floor, sure))
    rows = []
    for label, floor, sure in rules:
        row: list[object] = [label]
        for kind in kinds:
            group = [i for i in items if i.kind == kind]
            ended = sum(ends(i, threshold, floor, sure) for i in group)
            shown = ended if kind != "whole" else len(group) - ended
            row.append(f"{shown}/{len(group)}")
        rows.append(row)
    print(table(rows, ["rule", "unfinished ended", "stands alone ended", "whole held"]))


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--set", choices=("tuning", "measurement"), default="tuning")
    parser.add_argument("--verbose", action="store_true", help="a line per prompt")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    settings = load_settings({})
    prompts = telephone_prompts(args.set)
    turn = registry.create("turn", "smart-turn", settings)
    stt = registry.create("stt", settings.stt, settings)
    llama = EmbeddedLlamaServer(weights_for(default_model_path(), "q8_0"), threads=2, ctx=1024)
    await llama.start(supervise=False)
    judge = WordsJudge(llama.base_url)
    items: list[Heard] = []
    try:
        for prompt in prompts:
            heard = []
            gap = hesitant_cut(prompt)
            if gap is not None:
                kind = "stands alone" if prompt.name in STANDS_ALONE else "unfinished"
                heard.append(await hear(prompt.name, kind, prompt.audio[:gap], turn, stt, judge))
            heard.append(await hear(prompt.name, "whole", prompt.audio, turn, stt, judge))
            items.extend(heard)
            for item in heard if args.verbose else []:
                print(
                    f"{item.kind:12} {item.name:28} voice {item.voice:.2f} "
                    f"words {item.words:.2f}  {item.text!r}",
                    flush=True,
                )
    finally:
        await judge.close()
        await llama.stop()
        turn.close()
        stt.close()
    threshold = EAGERNESS[SERVER_EAGERNESS].threshold
    print(f"\n{args.set} set: {len(items)} judgements (Smart Turn threshold {threshold:g})\n")
    report(items, threshold)


if __name__ == "__main__":
    asyncio.run(main())
