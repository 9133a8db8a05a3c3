"""Which words were heard when a reply is cut off: frame accounting between
the reply and the paced track, with scripted text and fixed-length audio so
the expected answer is exact (the models' own tests are elsewhere)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import numpy as np

from voice_agent.backends.base import ChatMessage, ToolCall, ToolChoice, ToolSpec
from voice_agent.rtc.outbound import PacedAudioTrack
from voice_agent.session.conversation import Conversation
from voice_agent.session.events import ResponseFinished, SessionEvent
from voice_agent.session.reply import Reply, ReplySettings

WORD_SAMPLES = 4_321  # 90 ms at 48 kHz: pieces never end on a frame boundary


class ScriptedLlm:
    name = "scripted"

    def __init__(self, text: str) -> None:
        self.text = text

    async def stream_reply(
        self,
        messages: list[ChatMessage],
        max_tokens: int,
        temperature: float,
        tools: Sequence[ToolSpec] = (),
        tool_choice: ToolChoice = "auto",
    ) -> AsyncIterator[str | ToolCall]:
        for word in self.text.split(" "):
            yield word + " "

    async def prefill(self, messages: list[ChatMessage], tools: Sequence[ToolSpec] = ()) -> None:
        return None

    async def aclose(self) -> None:
        return None


class WordTones:
    """Speaks every word as WORD_SAMPLES of tone."""

    name = "tones"
    sample_rate = 48_000

    def voices(self) -> Sequence[str]:
        return ("tones",)

    async def stream(
        self, text: str, voice: str | None = None, urgent: bool = False
    ) -> AsyncIterator[np.ndarray]:
        yield np.full(len(text.split()) * WORD_SAMPLES, 3000, dtype=np.int16)

    def close(self) -> None:
        return None


async def play_and_cut(text: str, frames: int) -> tuple[str, Conversation]:
    track = PacedAudioTrack(buffer_ms=2000)
    events: list[SessionEvent] = []
    conversation = Conversation("", 4)
    response = Reply(
        "resp_1",
        "item_1",
        [ChatMessage("user", "hi")],
        ScriptedLlm(text),
        WordTones(),
        track,
        conversation,
        events.append,
        ReplySettings(100, 0.0),
    )
    track.on_audio_frame = response.frame_sent
    response.start()
    response.commit()
    played = 0
    while played < frames:
        samples, _ = await track.next_frame()
        played += samples is not None
    response.cancel("turn_detected")
    await response.wait_closed()
    track.stop()
    finished = events[-1]
    assert isinstance(finished, ResponseFinished) and finished.status == "cancelled"
    return finished.transcript, conversation


TEXT = "One two three four five six, seven eight nine ten eleven. Twelve thirteen fourteen."
# Pieces: "One ... six," (6 words), "seven ... eleven." (5), "Twelve ... fourteen." (3).
# The first two end at sample 11 x 4,321 = 47,531, inside frame 50.


async def test_a_cut_just_after_two_pieces_keeps_both_whole() -> None:
    heard, conversation = await play_and_cut(TEXT, frames=50)
    assert heard == "One two three four five six, seven eight nine ten eleven."
    assert conversation.history == [ChatMessage("assistant", heard)]


async def test_a_cut_inside_the_third_piece_keeps_its_played_share() -> None:
    heard, _ = await play_and_cut(TEXT, frames=58)  # 9 of its 14 frames: 1 of 3 words
    assert heard == "One two three four five six, seven eight nine ten eleven. Twelve"


async def test_cut_inside_the_first_piece_keeps_the_words_played() -> None:
    heard, _ = await play_and_cut("alpha beta gamma delta epsilon zeta eta.", frames=10)
    # 10 frames = 9,600 samples: two whole words of 4,321.
    assert heard == "alpha beta"
