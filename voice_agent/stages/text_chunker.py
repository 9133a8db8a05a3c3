"""Cut a streaming LLM reply into pieces worth synthesising on their own.

Speaking starts when the first piece is ready, so the first cut comes early:
at the first clause boundary (comma, colon, dash...), or, if none comes, after
a few words at a word boundary: a slightly flatter phrase break is a far
smaller cost than waiting for a whole sentence to be generated and spoken.
Later pieces prefer whole sentences, which Piper phrases more naturally, but
still cut long sentences at clauses so no piece waits on many tokens.
Text meant for the eye (markdown, emoji) is removed before it is spoken.
"""

from __future__ import annotations

import re

_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*\s")
_CLAUSE_END = re.compile(r"[,;:—–]\s|\s[-–—]\s")
# Abbreviations whose period does not end a sentence.
_ABBREVIATIONS = {
    "mr.",
    "mrs.",
    "ms.",
    "dr.",
    "prof.",
    "sr.",
    "jr.",
    "st.",
    "vs.",
    "etc.",
    "e.g.",
    "i.e.",
    "approx.",
    "no.",
    "inc.",
    "ltd.",
    "co.",
    "mt.",
    "u.s.",
}
_MARKDOWN = re.compile(r"(\*\*|__|`+|^#+\s*|^\s*[-*+]\s+|^\s*\d+\.\s+)", re.MULTILINE)
_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_EMOJI = re.compile(
    "[\U0001f000-\U0001faff\U00002600-\U000027bf\U0001f900-\U0001f9ff\ufe0f\u200d]+"
)
# Marks that end the first piece the moment they arrive, before the space
# after them (one token sooner: ~22 ms of the embedded LLM here). An en dash
# is left out: it joins as often as it breaks ("1990–2000", "York–based").
_SENTENCE_MARKS = ".!?…"
_CLAUSE_MARKS = ",;:—"
# After a digit these may still be inside a number: "3.5", "1,000", "10:30", "10—20".
_NUMBER_MARKS = ".,:—"
_SPACES = re.compile(r"\s+")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([.,!?;:])")


def speakable(text: str) -> str:
    """Strip markup and symbols that would be read out literally."""
    text = _LINK.sub(r"\1", text)
    text = _MARKDOWN.sub("", text)
    text = _EMOJI.sub("", text)
    text = text.replace("*", "").replace("#", "")
    return _SPACE_BEFORE_PUNCT.sub(r"\1", _SPACES.sub(" ", text)).strip()


def _says_something(piece: str) -> bool:
    """Marks alone (the "!" of a "?!" cut between them) have nothing to say."""
    return any(char.isalnum() for char in piece)


class TextChunker:
    def __init__(
        self, first_min_words: int = 1, clause_min_words: int = 6, first_max_words: int = 5
    ) -> None:
        self._buffer = ""
        self._first_min_words = first_min_words
        self._first_max_words = first_max_words
        self._clause_min_words = clause_min_words
        self._emitted = 0

    def push(self, delta: str) -> list[str]:
        """Add streamed text; return the pieces that are now complete."""
        self._buffer += delta
        pieces: list[str] = []
        while True:
            cut = self._find_cut()
            if cut is None:
                return pieces
            piece, self._buffer = self._buffer[:cut], self._buffer[cut:]
            spoken = speakable(piece)
            if _says_something(spoken):
                pieces.append(spoken)
                self._emitted += 1

    def flush(self) -> list[str]:
        """End of the reply: whatever is left is the last piece."""
        rest, self._buffer = speakable(self._buffer), ""
        return [rest] if _says_something(rest) else []

    def _find_cut(self) -> int | None:
        for match in _SENTENCE_END.finditer(self._buffer):
            if not self._is_abbreviation(match.start()):
                return match.end()
        min_words = self._first_min_words if self._emitted == 0 else self._clause_min_words
        for match in _CLAUSE_END.finditer(self._buffer):
            if len(self._buffer[: match.start()].split()) >= min_words:
                return match.end()
        if self._emitted == 0 and self._ends_now():
            return len(self._buffer)
        if self._emitted == 0:
            # Cut after first_max_words complete words (a word is complete once
            # whitespace follows it).
            words = list(re.finditer(r"\S+\s", self._buffer))
            if len(words) > self._first_max_words:
                return words[self._first_max_words - 1].end()
        return None

    def _ends_now(self) -> bool:
        """The buffer ends in punctuation that can only end a clause or a
        sentence, though the space after it has not come yet."""
        text = self._buffer
        mark, words = text[-1:], text[:-1].split()
        if not words or mark not in _SENTENCE_MARKS + _CLAUSE_MARKS:
            return False
        if mark in _NUMBER_MARKS and text[-2].isdigit():
            return False
        if mark == ".":
            # "e.g.", "p.m.", "U.S." and initials come a letter at a time.
            word = words[-1]
            if len(word) < 2 or "." in word or self._is_abbreviation(len(text) - 1):
                return False
        if mark in _CLAUSE_MARKS:
            return len(words) >= self._first_min_words
        return True

    def _is_abbreviation(self, period_index: int) -> bool:
        word_start = self._buffer.rfind(" ", 0, period_index) + 1
        word = self._buffer[word_start : period_index + 1].lower()
        if word in _ABBREVIATIONS:
            return True
        # "3.5" is not a sentence end, nor is a single initial ("J. Smith").
        before = self._buffer[word_start:period_index]
        return len(before) == 1 and before.isalpha() and before.isupper()
