"""Cancelling a reply: immediate silence, nothing stale emitted, history = what was heard.

Runs a real reply (llama.cpp + Piper) into the real paced track, without
WebRTC, so the frames that went out can be counted exactly."""

from __future__ import annotations

import asyncio

import numpy as np

from voice_agent.backends.base import ChatMessage
from voice_agent.engine import Engine
from voice_agent.rtc.outbound import PacedAudioTrack
from voice_agent.session.conversation import Conversation
from voice_agent.session.events import (
    AssistantAudioCleared,
    AssistantAudioStarted,
    ResponseFinished,
    SessionEvent,
    UserSpeechStarted,
)
from voice_agent.session.reply import Reply, ReplySettings
from voice_agent.session.session import VoiceSession
from voice_agent.stages.turns import FRAME_SAMPLES
from voice_agent.stages.vad import SpeechDetector
from voice_agent.testing.audio_data import librivox, silence


def make_response(
    engine: Engine, track: PacedAudioTrack, events: list[SessionEvent], conversation: Conversation
) -> Reply:
    assert engine.models is not None
    return Reply(
        response_id="resp_test",
        item_id="item_test",
        messages=[
            ChatMessage("system", "Tell a long story in many short sentences."),
            ChatMessage("user", "Tell me about the sea."),
        ],
        llm=engine.models.llm,
        tts=engine.models.tts,
        output=track,
        conversation=conversation,
        emit=events.append,
        reply=ReplySettings(max_tokens=120, temperature=0.0),
    )


async def test_cancel_mid_sentence_silences_the_next_frame(engine: Engine) -> None:
    track = PacedAudioTrack()
    events: list[SessionEvent] = []
    conversation = Conversation("", history_turns=4)
    response = make_response(engine, track, events, conversation)
    track.on_audio_frame = lambda tag: response.frame_sent(tag)
    response.start()
    response.commit()

    sent = 0
    while sent < 40:  # 0.8 s of the reply goes out
        samples, _ = await track.next_frame()
        if samples is not None:
            sent += 1
    response.cancel("turn_detected")

    assert response.status == "cancelled"
    next_frames = [(await track.next_frame())[0] for _ in range(3)]
    assert next_frames == [None, None, None]
    assert track.buffered_frames == 0

    kinds = [type(e) for e in events]
    assert AssistantAudioStarted in kinds
    assert kinds[-2:] == [AssistantAudioCleared, ResponseFinished]
    finished = events[-1]
    assert isinstance(finished, ResponseFinished)
    assert finished.status == "cancelled" and finished.reason == "turn_detected"
    # 0.8 s of speech is a few words: the heard text is a strict prefix.
    heard = finished.transcript
    assert heard and response.full_text().startswith(heard)
    assert len(heard.split()) < len(response.full_text().split()) or len(heard) < 80
    assert conversation.history == [ChatMessage("assistant", heard)]

    await asyncio.wait_for(response.wait_closed(), 2)
    await asyncio.sleep(0.2)  # real time: a while in which nothing more may arrive
    assert len(events) == len(kinds)  # nothing stale arrives after the cancel
    track.stop()


async def test_an_uncommitted_reply_is_dropped_without_a_trace(engine: Engine) -> None:
    track = PacedAudioTrack()
    events: list[SessionEvent] = []
    conversation = Conversation("", history_turns=4)
    response = make_response(engine, track, events, conversation)
    response.start()  # speculative: prepared, never committed
    # Prepared: its first words are spoken into audio that waits for a
    # commit (polled: nothing marks it), however slow this host's LLM.
    async with asyncio.timeout(60):
        while response._queue.empty():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    response.cancel("superseded")
    await asyncio.wait_for(response.wait_closed(), 2)
    assert events == []
    assert conversation.history == []
    assert track.buffered_frames == 0
    track.stop()


async def test_speech_over_a_reply_pauses_it_before_the_turn_starts(engine: Engine) -> None:
    """In a session: 60 ms of speech over the reply pause the track (the
    turn starts at 100 ms), two quiet frames lift the pause and the reply
    goes on; a switch to turns by hand mid-onset lifts it too."""
    assert engine.models is not None
    track = PacedAudioTrack()
    events: list[SessionEvent] = []
    session = VoiceSession(engine.models, engine.session_config(), track, events.append)
    speech = SpeechDetector(engine.models.vad)
    clip = librivox("0930")
    frames = [clip[i : i + FRAME_SAMPLES] for i in range(0, len(clip), FRAME_SAMPLES)]
    voiced = [speech.probability(f) >= session._detector.threshold for f in frames]
    start = next(i for i in range(len(frames)) if all(voiced[i : i + 5]))
    onset = np.concatenate(frames[start : start + 3])  # 60 ms, voiced throughout
    try:
        session.add_user_text("Tell me about the sea.")
        assert session.create_response()
        session.push_audio(onset, from_track=False)
        assert track.paused
        assert not any(isinstance(e, UserSpeechStarted) for e in events)  # no turn yet
        session.push_audio(silence(0.04), from_track=False)
        assert not track.paused  # a click: the reply goes on
        assert session._response is not None and session._response.status == "in_progress"
        session.push_audio(onset, from_track=False)
        assert track.paused
        session.set_turn_detection(None)  # push-to-talk from here
        assert not track.paused
    finally:
        await session.close()
        track.stop()
