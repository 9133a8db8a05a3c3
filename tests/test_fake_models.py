"""The fake STT and TTS (voice_agent/testing/fake_models.py) keep their
promises, and the fake engine runs a real session over them: a WebSocket
call whose spoken turn is transcribed from its length and answered with the
scripted LLM's reply in the fake voice. No model is loaded."""

from __future__ import annotations

import asyncio
import base64
import re

import aiohttp
import numpy as np
import pytest

from tests.conftest import FAKE_REPLY, ServerFactory
from tests.conftest import test_settings as settings_with
from tests.realtime_events import appended_audio, typed
from tests.test_websocket import audio_of, events_until, ws_url
from voice_agent.backends import registry
from voice_agent.backends.base import synthesize
from voice_agent.backends.capabilities import (
    CarefulTranscriber,
    PartialTranscriber,
    ReportsStats,
    SpeculativeTranscriber,
    WarmsUp,
)
from voice_agent.engine import Engine
from voice_agent.testing.fake_models import (
    TTS_RATE,
    WORD_MS,
    FakeModelError,
    FakeStt,
    FakeTts,
    derived_transcript,
    speech_ms,
)
from voice_agent.testing.scripted_llm import Script, ScriptedLlmServer, text_events


def tone(seconds: float, amplitude: float = 3000.0, rate: int = 16_000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return (amplitude * np.sin(2 * np.pi * 300 * t)).astype(np.int16)


def gap(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * 16_000), dtype=np.int16)


def test_the_fakes_are_backends_in_the_registry() -> None:
    settings = settings_with(stt="fake", tts="fake")
    stt = registry.create("stt", "fake", settings)
    tts = registry.create("tts", "fake", settings)
    assert isinstance(stt, FakeStt) and isinstance(tts, FakeTts)
    # The capabilities the engine and the session probe: a plain transcriber
    # with partials (off by default), a warm-up, stats; no careful redecode.
    assert isinstance(stt, PartialTranscriber) and stt.default_partial_interval_ms == 0
    assert isinstance(stt, WarmsUp) and isinstance(stt, ReportsStats)
    assert not isinstance(stt, CarefulTranscriber | SpeculativeTranscriber)


async def test_the_stt_gives_scripted_words_first_then_the_speech_s_length() -> None:
    stt = FakeStt()
    speech = np.concatenate((gap(0.3), tone(1.2), gap(0.5), tone(0.4)))
    assert speech_ms(speech) == 1600
    stt.script("Hello there.", "Goodbye.")
    assert await stt.transcribe(speech) == "Hello there."
    assert await stt.transcribe(speech) == "Goodbye."
    assert await stt.transcribe(speech) == "1600 milliseconds of speech"
    assert await stt.transcribe(gap(2.0)) == ""  # silence: no words, as a model
    assert await stt.transcribe(tone(2.0, amplitude=200)) == ""  # a hum below speech
    assert await stt.transcribe_partial(tone(0.5)) == derived_transcript(tone(0.5))
    assert stt.heard == ["Hello there.", "Goodbye.", "1600 milliseconds of speech", "", ""]
    assert stt.stats() == {"backend": "fake", "requests": {"final": 5, "partial": 1}}
    stt.fail_next()
    with pytest.raises(FakeModelError):
        await stt.transcribe(speech)
    assert await stt.transcribe(speech) == "1600 milliseconds of speech"
    stt.close()
    with pytest.raises(FakeModelError):
        await stt.transcribe(speech)


async def test_the_tts_says_each_word_as_a_tone_chunk_in_the_voice_asked() -> None:
    tts = FakeTts()
    assert tts.sample_rate == TTS_RATE and tts.voices()[0] == "fake"
    chunks = [chunk async for chunk in tts.stream("Hello, how are you?", urgent=True)]
    assert len(chunks) == 4
    assert all(c.dtype == np.int16 and c.size == TTS_RATE * WORD_MS // 1000 for c in chunks)
    audio = await synthesize(tts, "Hello, how are you?")
    assert np.array_equal(audio, np.concatenate(chunks))  # deterministic
    assert tts.duration_s("Hello, how are you?") == pytest.approx(audio.size / TTS_RATE)
    assert 2000 < int(np.abs(audio).max()) < 4000  # sound, and quiet
    high = await synthesize(tts, "Hello, how are you?", voice="fake-high")
    assert not np.array_equal(high, audio)  # another voice, another tone
    assert (await synthesize(tts, "...")).size == 0  # no words, no audio
    assert tts.spoken[0] == ("Hello, how are you?", "fake", True)
    with pytest.raises(ValueError, match="no fake voice"):
        await synthesize(tts, "Hi.", voice="alloy")
    tts.fail_next()
    with pytest.raises(FakeModelError):
        await synthesize(tts, "Hi.")


async def test_the_tts_stops_before_the_next_chunk_when_its_reader_stops() -> None:
    tts = FakeTts()
    stream = tts.stream("one two three four five")
    assert (await anext(stream)).size
    await stream.aclose()
    assert tts.chunks_sent == 1 and tts.cancelled == 1

    async def read_all() -> None:  # as the session reads a piece
        chunks = tts.stream("one two three four five")
        try:
            async for _ in chunks:
                await asyncio.sleep(1)  # a slow consumer, cancelled while it plays
        finally:
            await chunks.aclose()

    reader = asyncio.ensure_future(read_all())
    await asyncio.sleep(0.05)
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert tts.chunks_sent == 2 and tts.cancelled == 2


async def test_the_fake_engine_starts_no_llama_server_and_warms_its_models(
    fake_engine: Engine, fake_llm: ScriptedLlmServer
) -> None:
    assert fake_engine.llama is None and fake_engine.ready
    assert fake_engine.llm_config is not None
    assert fake_engine.llm_config.base_url == fake_llm.base_url
    assert fake_engine.models is not None
    assert isinstance(fake_engine.models.stt, FakeStt) and fake_engine.models.stt.warmed_up
    assert fake_engine.voice_name == "fake"
    assert [v["name"] for v in fake_engine.voice_catalog()] == ["fake", "fake-high"]


async def test_a_spoken_turn_is_heard_by_its_length_and_answered_in_the_fake_voice(
    fake_server_factory: ServerFactory, fake_engine: Engine, http: aiohttp.ClientSession
) -> None:
    assert fake_engine.models is not None
    tts = fake_engine.models.tts
    assert isinstance(tts, FakeTts)
    server = await fake_server_factory()
    async with http.ws_connect(ws_url(server), protocols=("realtime",)) as ws:
        await events_until(ws, "session.created", 10)
        # 1.2 s of "speech", then the silence that ends the turn.
        for event in appended_audio(np.concatenate((gap(0.3), tone(1.2), gap(1.5)))):
            await ws.send_json(event)
        events = await events_until(ws, "response.done", 20)
    heard = [e for e in events if e["type"].endswith("input_audio_transcription.completed")]
    assert len(heard) == 1, heard
    said_ms = re.fullmatch(r"(\d+) milliseconds of speech", heard[0]["transcript"])
    # Whole 20 ms frames of the tone, after two resamplings (24 kHz and back).
    assert said_ms is not None and 1200 <= int(said_ms[1]) <= 1240, heard
    done = next(e for e in events if e["type"] == "response.done")["response"]
    assert done["status"] == "completed", done.get("status_details")
    assert done["output"][0]["content"][0]["transcript"] == FAKE_REPLY
    audio = audio_of(events)  # 24 kHz on the wire
    said = tts.duration_s(FAKE_REPLY)
    assert audio.size == pytest.approx(said * 24_000, rel=0.05)
    assert int(np.abs(audio).max()) > 2000
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_a_typed_turn_uses_the_scripted_llm_and_a_queued_reply_comes_first(
    fake_server_factory: ServerFactory, fake_llm: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    fake_llm.add(Script(text_events("chat-completions", "Queued ", "words.")))
    async with http.ws_connect(ws_url(server), protocols=("realtime",)) as ws:
        await events_until(ws, "session.created", 10)
        for text, expected in (("Hi.", "Queued words."), ("Again.", FAKE_REPLY)):
            await ws.send_json(typed(text))
            await ws.send_json({"type": "response.create"})
            events = await events_until(ws, "response.done", 20)
            done = events[-1]["response"]
            assert done["status"] == "completed", done.get("status_details")
            assert done["output"][0]["content"][0]["transcript"] == expected
            deltas = [e for e in events if e["type"] == "response.output_audio.delta"]
            assert deltas and base64.b64decode(deltas[0]["delta"])
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
