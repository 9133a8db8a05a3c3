"""What a reply puts on the wire: the real Piper voice, a scripted LLM and
the real paced track. A reply starts at its first audible sound (the
voice's lead-in cut, unless turned off), and a TTS that streams has its
chunks played in order as they come."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import numpy as np
import pytest

from tests.test_heard_text import ScriptedLlm
from voice_agent.backends.base import ChatMessage, TtsBackend
from voice_agent.backends.tts.piper_tts import PiperTts, default_voice_path
from voice_agent.rtc.outbound import PacedAudioTrack
from voice_agent.session.events import ResponseFinished, SessionEvent
from voice_agent.session.reply import LEAD_THRESHOLD, Reply, ReplySettings


@pytest.fixture(scope="module")
def piper() -> PiperTts:
    return PiperTts(default_voice_path(), 1.0, threads=1)


async def frames_of_reply(text: str, tts: TtsBackend, trim_lead: bool) -> list[np.ndarray]:
    """The reply's audio frames as the track sends them, until it ends."""
    track = PacedAudioTrack(buffer_ms=2000)
    events: list[SessionEvent] = []
    response = Reply(
        "resp_1",
        "item_1",
        [ChatMessage("user", "hi")],
        ScriptedLlm(text),
        tts,
        track,
        None,
        events.append,
        ReplySettings(100, 0.0, trim_lead=trim_lead),
    )
    track.on_audio_frame = response.frame_sent
    response.start()
    response.commit()
    frames: list[np.ndarray] = []
    while not (events and isinstance(events[-1], ResponseFinished)):
        samples, _ = await track.next_frame()
        if samples is not None:
            frames.append(samples)
    await response.wait_closed()
    track.stop()
    return frames


def onset(frames: list[np.ndarray]) -> int:
    """Index of the first sample above the lead-in threshold."""
    samples = np.abs(np.concatenate(frames).astype(np.int32))
    return int(np.flatnonzero(samples > LEAD_THRESHOLD)[0])


def silent_frames_first(frames: list[np.ndarray]) -> int:
    loud = [
        i for i, f in enumerate(frames) if int(np.abs(f.astype(np.int32)).max()) > LEAD_THRESHOLD
    ]
    return loud[0]


@pytest.mark.models
async def test_a_reply_starts_at_its_first_audible_sound(piper: PiperTts) -> None:
    trimmed = await frames_of_reply("Hello there.", piper, trim_lead=True)
    untrimmed = await frames_of_reply("Hello there.", piper, trim_lead=False)
    assert silent_frames_first(trimmed) == 0
    # Piper starts with up to 55 ms of near-silence (its noise makes it
    # vary, sometimes under one frame): the trimmed reply keeps 10 ms of it.
    trimmed_onset, untrimmed_onset = onset(trimmed), onset(untrimmed)
    assert trimmed_onset <= 0.011 * 48_000
    assert untrimmed_onset >= trimmed_onset
    # Only the lead-in went: from its first sound on, the reply is about the
    # same length (Piper's noise varies its durations by -2.2 to +1.8 frames
    # in 15 runs, on top of the 0-3 frames of lead-in that went; a word is 10+).
    frame = len(trimmed[0])
    from_onset = [
        len(f) * frame - start
        for f, start in ((trimmed, trimmed_onset), (untrimmed, untrimmed_onset))
    ]
    assert abs(from_onset[0] - from_onset[1]) <= 5 * frame, from_onset


class ChunkedTones:
    """A streaming TTS: each word is its own chunk, a distinct tone level."""

    name = "chunked"
    sample_rate = 48_000

    def __init__(self) -> None:
        self.closed_streams = 0

    def voices(self) -> Sequence[str]:
        return ("tones",)

    async def stream(
        self, text: str, voice: str | None = None, urgent: bool = False
    ) -> AsyncIterator[np.ndarray]:
        try:
            for word in text.split():
                yield np.full(960 * 3, 1000 + 100 * len(word), dtype=np.int16)
        finally:
            self.closed_streams += 1

    def close(self) -> None:
        return None


async def test_streamed_chunks_are_played_in_order_and_every_stream_is_closed() -> None:
    tts = ChunkedTones()
    text = "a bb ccc dddd"  # one piece: four chunks of three frames
    frames = await frames_of_reply(text, tts, trim_lead=True)
    levels = [int(f.max()) for f in frames]
    assert levels == [1100] * 3 + [1200] * 3 + [1300] * 3 + [1400] * 3
    assert tts.closed_streams == 1


class BreaksOff(ChunkedTones):
    """Streams the first two words of a piece, then its connection dies."""

    async def stream(
        self, text: str, voice: str | None = None, urgent: bool = False
    ) -> AsyncIterator[np.ndarray]:
        words = text.split()
        if "apology" in text.lower() or "sorry" in text.lower():
            raise RuntimeError("the TTS server is unreachable")
        for word in words[:2]:
            yield np.full(960 * 3, 1000 + 100 * len(word), dtype=np.int16)
        raise RuntimeError("the stream broke off")


async def test_a_piece_whose_stream_broke_off_is_not_reported_as_heard() -> None:
    text = "one two three four five six seven eight nine ten eleven twelve."
    track = PacedAudioTrack(buffer_ms=2000)
    events: list[SessionEvent] = []
    response = Reply(
        "resp_1",
        "item_1",
        [ChatMessage("user", "hi")],
        ScriptedLlm(text),
        BreaksOff(),
        track,
        None,
        events.append,
        ReplySettings(100, 0.0),
    )
    track.on_audio_frame = response.frame_sent
    response.start()
    response.commit()
    while not (events and isinstance(events[-1], ResponseFinished)):
        await track.next_frame()
    await response.wait_closed()
    track.stop()
    finished = events[-1]
    assert finished.status == "failed"
    # Six frames of a clause that would have lasted ~200: a word at most,
    # not the clause; the apology, which could not be synthesised, not at all.
    heard = finished.transcript.split()
    assert len(heard) <= 1 and "Sorry" not in finished.transcript, finished.transcript
