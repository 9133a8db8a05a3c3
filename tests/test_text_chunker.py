from __future__ import annotations

from voice_agent.stages.text_chunker import TextChunker, speakable


def feed(text: str, step: int = 3) -> list[str]:
    chunker = TextChunker()
    pieces: list[str] = []
    for i in range(0, len(text), step):
        pieces += chunker.push(text[i : i + step])
    return pieces + chunker.flush()


def test_first_piece_is_cut_at_the_first_clause() -> None:
    pieces = feed("Well, I think you might want to go to the store today, then come home.")
    assert pieces[0] == "Well,"
    assert pieces[1] == "I think you might want to go to the store today,"


def test_first_piece_without_punctuation_is_cut_after_a_few_words() -> None:
    pieces = feed("This is a classic example of how we can merge the boundaries. Yes.")
    assert pieces == ["This is a classic example", "of how we can merge the boundaries.", "Yes."]


def test_sentences_are_cut_and_nothing_is_lost() -> None:
    text = "Sure thing. The price is 3.5 dollars today! Is that all? Great."
    pieces = feed(text)
    assert pieces == ["Sure thing.", "The price is 3.5 dollars today!", "Is that all?", "Great."]


def test_abbreviations_and_initials_do_not_end_sentences() -> None:
    pieces = feed("Yes. Ask Dr. Smith and J. Jones about it. Then call Mr. Brown.")
    assert pieces == ["Yes.", "Ask Dr. Smith and J. Jones about it.", "Then call Mr. Brown."]


def test_long_sentences_are_cut_at_clauses_after_the_first_piece() -> None:
    pieces = feed(
        "Yes. When you arrive at the station in the morning, take the second exit on the left, "
        "and walk for ten minutes."
    )
    assert pieces[0] == "Yes."
    assert pieces[1].endswith("morning,")
    assert " ".join(pieces).count("ten minutes") == 1


def test_markdown_and_emoji_are_not_spoken() -> None:
    assert speakable("**Bold** and `code` 😀 [a link](http://x) # heading") == (
        "Bold and code a link heading"
    )
    assert feed("- one 🙂.\n- **two**.") == ["one.", "two."]


def test_flush_returns_the_unterminated_tail() -> None:
    chunker = TextChunker()
    assert chunker.push("no punctuation at all") == []
    assert chunker.flush() == ["no punctuation at all"]
    assert chunker.flush() == []


def test_the_first_piece_ends_when_its_punctuation_arrives() -> None:
    # The LLM streams tokens: waiting for the space after a full stop costs a token.
    chunker = TextChunker()
    assert chunker.push("That's a great") == []
    assert chunker.push(" example.") == ["That's a great example."]
    assert chunker.push(" A more respectable man.") == []  # later pieces: the space too
    assert chunker.push(" He") == ["A more respectable man."]
    for opening in ("Well,", "Really?", "Sure!", "Yes;"):
        assert TextChunker().push(opening) == [opening]


def test_punctuation_that_may_go_on_does_not_end_the_first_piece() -> None:
    for start, rest, whole in (
        ("It costs 3.", "5 dollars. More.", "It costs 3.5 dollars."),
        ("About 1,", "000 people. More.", "About 1,000 people."),
        ("At 10:", "30 sharp. More.", "At 10:30 sharp."),
        ("Ask Dr.", " Smith today. More.", "Ask Dr. Smith today."),
        ("Ask J.", " Jones now. More.", "Ask J. Jones now."),
        ("At 5 p.", "m. sharp. More.", "At 5 p.m."),  # as before: "p.m." may end one
        ("For e.g.", " apples. More.", "For e.g. apples."),
        ("From 1990—", "2000 it grew. More.", "From 1990—2000 it grew."),
        ("From 1990–", "2000 it grew. More.", "From 1990–2000 it grew."),
    ):
        chunker = TextChunker()
        assert chunker.push(start) == []
        assert chunker.push(rest)[0] == whole


def test_marks_split_from_their_piece_are_not_spoken_alone() -> None:
    chunker = TextChunker()
    assert chunker.push("Really?") == ["Really?"]
    assert chunker.push("! I had no idea. ") == ["I had no idea."]
    assert chunker.push("...") == []
    assert chunker.flush() == []
