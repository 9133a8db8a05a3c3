"""Only speakable text reaches TTS: reasoning, markdown and emoji are removed
from the stream however the deltas happen to be split."""

from __future__ import annotations

import pytest

from voice_agent.stages.text_filter import SpokenTextFilter, strip_thinking


def run(deltas: list[str]) -> str:
    spoken = SpokenTextFilter()
    return "".join(spoken.push(d) for d in deltas) + spoken.flush()


def every_split(text: str) -> list[list[str]]:
    """The text as one delta, as single characters, and cut at every position."""
    cuts = [[text], list(text)]
    cuts += [[text[:i], text[i:]] for i in range(1, len(text))]
    return cuts


@pytest.mark.parametrize(
    ("raw", "spoken"),
    [
        ("<think>The user greets me.</think>Hello there!", "Hello there!"),
        ("Sure. <think>hmm</think>It is noon.", "Sure. It is noon."),
        ("<think>never closed, budget ran out", ""),
        ("Stray close</think> tag.", "Stray close tag."),
        ("**Bold** and *italic* and `code`.", "Bold and italic and code."),
        ("# Title\n- first\n- second\n1. third", "Title\nfirst\nsecond\nthird"),
        ("See [the docs](https://example.com/x) now.", "See the docs now."),
        ("Great job! 🎉👍 Keep going ✨", "Great job!  Keep going "),
        ("__init__ and snake_case", "init and snake case"),
        ("> quoted line", "quoted line"),
        ("Plain text, 3 - 2 = 1 and 5 < 6.", "Plain text, 3 - 2 = 1 and 5 < 6."),
    ],
)
def test_filtering_does_not_depend_on_how_the_stream_is_split(raw: str, spoken: str) -> None:
    for deltas in every_split(raw):
        assert run(deltas) == spoken, deltas


def test_plain_text_is_not_held_back() -> None:
    spoken = SpokenTextFilter()
    assert spoken.push("Hello, how are") == "Hello, how are"
    assert spoken.push(" you") == " you"


def test_a_possible_tag_is_held_only_until_it_is_decided() -> None:
    spoken = SpokenTextFilter()
    assert spoken.push("Yes <thi") == "Yes "
    assert spoken.push("s is fine") == "<this is fine"


def test_history_text_keeps_markdown_but_not_thinking() -> None:
    assert strip_thinking("<think>plan</think>\n\n**Hi**") == "**Hi**"
