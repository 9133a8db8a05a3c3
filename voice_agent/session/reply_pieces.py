"""What of a reply the caller heard: its pieces, and the frames of each
that reached the wire.

A reply is spoken in pieces (clauses). The play task counts the frames each
piece's audio fills and the output track reports each frame it sends, so
when a reply is cut off (a barge-in, a cancel) what was heard is the whole
pieces played plus the played share of the words of the piece that was cut;
that is what the history keeps and what ``response.done`` reports. Of a
text-only reply, what was heard is what was told to the client. Apart from
the response because it is pure accounting over the pieces, with no task,
queue or backend: the response feeds it and asks it.
"""

from __future__ import annotations

from dataclasses import dataclass

from voice_agent.session.conversation import SpokenPiece, SpokenText

# Frames a piece whose audio never came in full would have lasted: speech
# runs at about 15 characters a second, 3.3 frames a character.
FRAMES_PER_CHAR = 3.3


@dataclass
class Piece:
    """One clause of the reply. Its frames are counted as its chunks are
    written; ``complete`` once the last of them was (a piece whose stream
    broke off, or is still coming, is not)."""

    index: int
    text: str
    frames_expected: int = 0
    frames_played: int = 0
    delivered: bool = False  # its words were told to the client
    complete: bool = False


class ReplyPieces:
    """One reply's pieces, by index."""

    def __init__(self, audio: bool) -> None:
        self._audio = audio  # False: a text-only reply, heard as it was told
        self._pieces: dict[int, Piece] = {}

    def new(self, index: int, text: str) -> Piece:
        piece = self._pieces[index] = Piece(index, text)
        return piece

    def frame_played(self, index: int) -> None:
        """The output track sent a frame of piece ``index``."""
        piece = self._pieces.get(index)
        if piece is not None:
            piece.frames_played += 1

    def heard_text(self, first: int = 0) -> str:
        """Whole pieces that were played, plus the played share of the words
        of the piece that was cut off (of the pieces from index ``first``);
        of a text-only reply, the pieces told to the client."""
        words: list[str] = []
        for index in sorted(i for i in self._pieces if i >= first):
            piece = self._pieces[index]
            if not self._audio:
                if not piece.delivered:
                    break
                words.extend(piece.text.split())
                continue
            if not piece.delivered:  # no audio of it ever reached the track
                break
            if piece.complete and piece.frames_played >= piece.frames_expected:
                words.extend(piece.text.split())
                continue
            # Cut off; if its stream broke off (or was still coming), its
            # length is estimated from its text.
            expected = piece.frames_expected
            if not piece.complete:
                expected = max(expected, int(len(piece.text) * FRAMES_PER_CHAR))
            if piece.frames_played > 0 and expected > 0:
                share = min(1.0, piece.frames_played / expected)
                piece_words = piece.text.split()
                words.extend(piece_words[: int(len(piece_words) * share)])
            break
        return " ".join(words)

    def full_text(self) -> str:
        return " ".join(self._pieces[i].text for i in sorted(self._pieces) if self._pieces[i].text)

    def spoke(self) -> bool:
        return any(piece.text for piece in self._pieces.values())

    def spoken(self, covered: int) -> SpokenText | None:
        """The timing of the pieces from ``covered`` on: the last round's,
        the message's own words."""
        if not self._audio:
            return None
        indices = sorted(self._pieces)
        before = sum(self._pieces[i].frames_played for i in indices if i < covered)
        pieces = tuple(
            SpokenPiece(p.text, p.frames_expected, p.frames_played)
            for p in (self._pieces[i] for i in indices if i >= covered)
        )
        return SpokenText(before, pieces)
