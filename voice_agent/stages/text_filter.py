"""Streaming filter between the LLM and the chunker: only speakable text
reaches TTS (and the transcript the client sees).

Removes ``<think>...</think>`` reasoning (tags may be split across deltas; a
think block that is never closed swallows the rest), markdown markup
(emphasis, headings, bullets, quotes, code ticks, links keep their text) and
emoji. It holds back only the few characters that may still turn out to be
markup, so it adds no latency to plain text.
"""

from __future__ import annotations

import re

OPEN, CLOSE = "<think>", "</think>"
# Pictographs, dingbats, symbols, flags, and the joiners/selectors that glue them.
_EMOJI = re.compile(
    "[\U0001f000-\U0001faff\U00002600-\U000027bf\U00002b00-\U00002bff"
    "\U0001f1e6-\U0001f1ff\ufe0f\u200d\u20e3]+"
)
_LINE_MARK = re.compile(r"[ \t]*(?:#{1,6}[ \t]+|[-*+][ \t]+|\d{1,3}[.)][ \t]+|>[ \t]?)")
_LINE_MARK_PREFIX = re.compile(r"[ \t]*(?:#{0,6}|[-*+]|\d{1,3}[.)]?|>)")
_LINK = re.compile(r"\[([^\]\n]{0,200})\]\(([^)\s]{0,500})\)")
_LINK_PREFIX = re.compile(r"\[[^\]\n]{0,200}(?:\]|\]\([^)\s]{0,500})?")
_SPECIAL = re.compile(r"[*_`~\[\n]")


def _held_tail(text: str, tags: tuple[str, ...]) -> int:
    """Length of the longest suffix of ``text`` that starts one of ``tags``."""
    for size in range(min(len(text), max(map(len, tags)) - 1), 0, -1):
        if any(tag.startswith(text[-size:]) for tag in tags):
            return size
    return 0


class ThinkStripper:
    def __init__(self) -> None:
        self._buf = ""
        self._thinking = False

    def push(self, delta: str) -> str:
        self._buf += delta
        out: list[str] = []
        while True:
            if self._thinking:
                end = self._buf.find(CLOSE)
                if end < 0:
                    self._buf = self._buf[len(self._buf) - _held_tail(self._buf, (CLOSE,)) :]
                    break
                self._buf, self._thinking = self._buf[end + len(CLOSE) :], False
                continue
            start, stray = self._buf.find(OPEN), self._buf.find(CLOSE)
            cut = min((i for i in (start, stray) if i >= 0), default=-1)
            if cut < 0:
                keep = _held_tail(self._buf, (OPEN, CLOSE))
                out.append(self._buf[: len(self._buf) - keep])
                self._buf = self._buf[len(self._buf) - keep :]
                break
            out.append(self._buf[:cut])
            if cut == start:
                self._buf, self._thinking = self._buf[cut + len(OPEN) :], True
            else:  # a close without an open: drop the tag only
                self._buf = self._buf[cut + len(CLOSE) :]
        return "".join(out)

    def flush(self) -> str:
        text, self._buf = ("" if self._thinking else self._buf), ""
        return text


class MarkdownStripper:
    def __init__(self) -> None:
        self._buf = ""
        self._line_start = True

    def push(self, delta: str, final: bool = False) -> str:
        self._buf += delta
        out: list[str] = []
        while self._buf:
            if self._line_start:
                mark = _LINE_MARK.match(self._buf)
                if mark is not None and mark.end() == len(self._buf) and not final:
                    break  # the mark may go on ("> " after ">")
                if mark is not None:
                    self._buf = self._buf[mark.end() :]
                    self._line_start = False
                    continue
                maybe = _LINE_MARK_PREFIX.fullmatch(self._buf)
                if maybe is not None and maybe.end() > 0 and not final:
                    break  # could still become a heading or a bullet
                self._line_start = False
            special = _SPECIAL.search(self._buf)
            if special is None:
                out.append(self._buf)
                self._buf = ""
                break
            out.append(self._buf[: special.start()])
            self._buf = self._buf[special.start() :]
            char = self._buf[0]
            if char == "\n":
                out.append("\n")
                self._buf = self._buf[1:]
                self._line_start = True
            elif char == "[":
                link = _LINK.match(self._buf)
                if link is not None:
                    out.append(link.group(1))
                    self._buf = self._buf[link.end() :]
                elif not final and _LINK_PREFIX.fullmatch(self._buf):
                    break  # wait for the rest of a possible link
                else:
                    self._buf = self._buf[1:]
            elif char == "_":
                run = len(self._buf) - len(self._buf.lstrip("_"))
                if run == len(self._buf) and not final:
                    break
                # "__bold__" markers vanish; a lone underscore reads as a space.
                out.append(" " if run == 1 else "")
                self._buf = self._buf[run:]
            else:  # * ` ~: emphasis, code, strike-through markers
                self._buf = self._buf[1:]
        return "".join(out)

    def flush(self) -> str:
        return self.push("", final=True)


class SpokenTextFilter:
    """``push`` each LLM delta, ``flush`` at the end; both return speakable text."""

    def __init__(self) -> None:
        self._think = ThinkStripper()
        self._markdown = MarkdownStripper()

    def push(self, delta: str) -> str:
        return _EMOJI.sub("", self._markdown.push(self._think.push(delta)))

    def flush(self) -> str:
        text = self._markdown.push(self._think.flush())
        return _EMOJI.sub("", text + self._markdown.flush())


def strip_thinking(text: str) -> str:
    """A whole text without its think blocks (for the conversation history)."""
    stripper = ThinkStripper()
    return (stripper.push(text) + stripper.flush()).strip()
