"""``--tts openai``: the remote TTS backend against a real HTTP server
speaking OpenAI's ``/v1/audio/speech`` (streamed PCM) around the real Piper
voice (voice_agent/testing/speech_server.py); real WebRTC callers hear it. Its failures
end as the LLM's do: an ``error`` event, the apology where the server can
still speak it, ``response.done`` failed, never silence unexplained."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from tests.conftest import run_server
from tests.conftest import test_settings as settings_with
from tests.stt_fixtures import engine_with_models
from tests.test_faults import (
    API,
    ask,
    assert_on_time,
    call_of,
    caller,
    failure_code,
    report,
    transcript,
    tts_failing_on_zanzibar,
)
from tests.test_stt_openai import unused_port
from voice_agent.backends import registry
from voice_agent.backends.base import synthesize
from voice_agent.backends.tts.hosted import OpenAITts, RemoteTtsError
from voice_agent.engine import Engine
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    close_quietly,
    make_llm,
    text_events,
)
from voice_agent.testing.speech_server import API_KEY, OPENAI_PCM_RATE, SpeechServer, speech_server

pytestmark = pytest.mark.e2e

TTS_TIMEOUT_S = 1.0
# In a call the test server makes a whole piece before its first write, on
# one Piper thread shared by every caller and with the calls' own load on
# two cores: a long piece can take over a second to begin.
CALL_TTS_TIMEOUT_S = 3.0


@pytest_asyncio.fixture
async def remote(engine: Engine) -> AsyncIterator[tuple[SpeechServer, str]]:
    """The speech server around the shared engine's Piper voice ("joe")."""
    assert engine.models is not None
    async with speech_server(engine.models.tts) as served:
        yield served


_clients: list[OpenAITts] = []


@pytest_asyncio.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    yield
    while _clients:
        await _clients.pop().aclose()


def remote_tts(base_url: str, **overrides: Any) -> OpenAITts:
    """``--tts openai --tts-base-url URL``, made as the engine makes it."""
    values: dict[str, Any] = {
        "tts": "openai",
        "tts_base_url": base_url,
        "tts_api_key": API_KEY,
        "tts_model": "piper-test",
        "tts_remote_voice": "joe",
        "tts_timeout_s": TTS_TIMEOUT_S,
    }
    values.update(overrides)
    tts = registry.create("tts", "openai", settings_with(**values))
    assert isinstance(tts, OpenAITts)
    _clients.append(tts)
    return tts


# -- the backend ----------------------------------------------------------------
async def test_chunks_are_yielded_as_the_server_streams_them(
    remote: tuple[SpeechServer, str],
) -> None:
    server, url = remote
    tts = remote_tts(url)
    assert tts.sample_rate == OPENAI_PCM_RATE and tts.voices() == ("joe",)
    text = "The quick brown fox jumps over the lazy dog."
    server.rest.clear()  # the server sends its first 50 ms, then waits
    chunks = tts.stream(text)
    first = await asyncio.wait_for(anext(chunks), 10)
    assert 0 < first.size <= OPENAI_PCM_RATE // 20 and first.dtype == np.int16
    server.rest.set()
    rest = [chunk async for chunk in chunks]
    audio = np.concatenate((first, *rest))
    # All of the piece's audio: a second of speech or more, every sample sent.
    assert server.sent == [audio.size] and audio.size > OPENAI_PCM_RATE
    assert int(np.abs(audio).max()) > 2000
    (body,) = server.bodies
    assert body == {
        "model": "piper-test",
        "input": text,
        "voice": "joe",
        "response_format": "pcm",
    }


async def test_voices_are_the_configured_names_the_default_first(
    remote: tuple[SpeechServer, str],
) -> None:
    server, url = remote
    tts = remote_tts(url, tts_remote_voice="joe", tts_remote_voices=["alloy", "joe", "marin"])
    assert tts.voices() == ("joe", "alloy", "marin")
    assert remote_tts(url, tts_remote_voice=None, tts_remote_voices="nova,echo").voices() == (
        "nova",
        "echo",
    )
    assert remote_tts(url, tts_remote_voice=None).voices() == ("alloy",)  # OpenAI's default
    # A voice the server lacks is its 400, quoted.
    with pytest.raises(RemoteTtsError, match=r"answered 400: .*'marin' is not one of joe"):
        await synthesize(tts, "Hello.", "marin")
    assert (await synthesize(tts, "Hello.", "joe")).size > 0
    assert [b["voice"] for b in server.bodies] == ["marin", "joe"]


async def test_each_failure_is_a_clear_error(remote: tuple[SpeechServer, str]) -> None:
    server, url = remote
    with pytest.raises(RemoteTtsError, match=r"answered 401: .*invalid api key"):
        await synthesize(remote_tts(url, tts_api_key="wrong"), "Hello.")
    server.poison = "Zanzibar"
    tts = remote_tts(url)
    server.fault = "error"
    with pytest.raises(RemoteTtsError, match=r"answered 500: .*device-side assert"):
        await synthesize(tts, "Zanzibar is an island.")
    server.fault = "hang"
    started = time.monotonic()
    with pytest.raises(RemoteTtsError, match=rf"gave no audio within {TTS_TIMEOUT_S:g} s"):
        await synthesize(tts, "Zanzibar is an island.")
    assert time.monotonic() - started < TTS_TIMEOUT_S + 2
    server.fault = "break"
    with pytest.raises(RemoteTtsError, match=r"broke off the audio after 50 ms"):
        await synthesize(tts, "Zanzibar is an island.")
    server.fault = "stall"
    with pytest.raises(RemoteTtsError, match=r"sent no more audio for 1 s after 50 ms of it"):
        await synthesize(tts, "Zanzibar is an island.")
    # The hung requests were hung up on, not left open.
    await asyncio.wait_for(server.wait_abandoned(2), 5)
    # Pieces without the word are served all the while.
    assert (await synthesize(tts, "Paris is a city.")).size > 0
    with unused_port() as port:
        down = remote_tts(f"http://127.0.0.1:{port}/v1")
        with pytest.raises(RemoteTtsError, match=r"cannot reach TTS server http://127.0.0.1"):
            await synthesize(down, "Hello.")
    stats = tts.stats()
    assert stats["errors"] == 4


def test_a_base_url_is_required() -> None:
    with pytest.raises(registry.BackendUnavailable, match="needs --tts-base-url"):
        registry.create("tts", "openai", settings_with(tts="openai"))


# -- callers ----------------------------------------------------------------------
REPLIES = [
    "Paris is the capital of France.",
    "Hello there, how can I help you today?",
    "Yes, it is sunny today.",
]


async def test_several_callers_hear_replies_spoken_by_the_remote_server(
    engine: Engine,
    remote: tuple[SpeechServer, str],
    peer: ScriptedLlmServer,
    http: aiohttp.ClientSession,
) -> None:
    server, url = remote
    tts = remote_tts(url, tts_timeout_s=CALL_TTS_TIMEOUT_S)
    llm = make_llm(API, peer.base_url)
    settings = settings_with(llm_prefill=False, tts="openai", tts_base_url=url)
    served = engine_with_models(engine, settings, llm=llm, tts=tts)
    # Every caller gets the same reply: the scripts are taken in arrival order.
    peer.add(*(Script(text_events(API, REPLIES[0])) for _ in REPLIES))
    try:
        async with run_server(settings, served) as srv:
            clients = [await caller(srv, http) for _ in REPLIES]
            created = clients[0].of_type("session.created")[0]
            assert created["session"]["audio"]["output"]["voice"] == "joe"
            asked_at = time.monotonic()
            done = await asyncio.wait_for(
                asyncio.gather(*(ask(c, "Where is Paris?") for c in clients)), 60
            )
            for client, response in zip(clients, done, strict=True):
                assert response["status"] == "completed", response.get("status_details")
                assert transcript(response) == REPLIES[0]
                first_sound = client.received.first_sound_after(asked_at)
                assert first_sound is not None, "no audible reply"
                assert client.received.peak_between(first_sound, first_sound + 1.0) > 2000
            assert server.most_in_flight >= 2  # the callers' pieces were asked at once
            assert len(server.bodies) >= len(REPLIES)
            assert_on_time(*(call_of(srv, c) for c in clients))
            for client in clients:
                await client.hangup(http)
            await asyncio.wait_for(srv.calls.wait_for_count(0), 5)
    finally:
        await close_quietly(llm)


async def test_a_piece_plays_while_the_server_is_still_sending_it(
    engine: Engine,
    remote: tuple[SpeechServer, str],
    peer: ScriptedLlmServer,
    http: aiohttp.ClientSession,
) -> None:
    server, url = remote
    tts = remote_tts(url, tts_timeout_s=CALL_TTS_TIMEOUT_S)
    llm = make_llm(API, peer.base_url)
    settings = settings_with(llm_prefill=False)
    served = engine_with_models(engine, settings, llm=llm, tts=tts)
    peer.add(Script(text_events(API, REPLIES[0])))  # one piece, ~2 s of speech
    try:
        async with run_server(settings, served) as srv:
            client = await caller(srv, http)
            # The server sends a piece's first half second, then holds the rest.
            server.held_after, server.rest = OPENAI_PCM_RATE // 2, asyncio.Event()
            asked_at = time.monotonic()
            reply = asyncio.create_task(ask(client, "Hello?"))
            await asyncio.wait_for(client.wait_for_type("output_audio_buffer.started"), 20)
            assert server.in_flight == 1 and not server.sent  # the piece is still coming
            server.rest.set()
            done = await asyncio.wait_for(reply, 20)
            assert done["status"] == "completed" and transcript(done) == REPLIES[0]
            assert len(server.sent) == 1 and server.sent[0] > OPENAI_PCM_RATE
            assert client.received.first_sound_after(asked_at) is not None
            await client.hangup(http)
    finally:
        await close_quietly(llm)


@pytest.mark.parametrize("fault", ["error", "hang", "break"])
@pytest.mark.slow
async def test_a_remote_tts_failing_on_a_piece_is_apologised_for(
    engine: Engine,
    remote: tuple[SpeechServer, str],
    peer: ScriptedLlmServer,
    http: aiohttp.ClientSession,
    fault: str,
) -> None:
    """The server answers 500 for, never answers, or breaks off mid-stream
    the piece holding "Zanzibar", and speaks everything else."""
    server, url = remote
    server.poison, server.fault = "Zanzibar", fault  # type: ignore[assignment]
    tts = remote_tts(url, tts_timeout_s=CALL_TTS_TIMEOUT_S)
    settings = settings_with(llm_prefill=False, tts_timeout_s=CALL_TTS_TIMEOUT_S)
    got = await tts_failing_on_zanzibar(engine, peer, http, settings, tts, f"remote tts {fault}")
    expected = {
        "error": "answered 500",
        "hang": f"gave no audio within {CALL_TTS_TIMEOUT_S:g} s",
        "break": "broke off the audio after 50 ms",
    }[fault]
    assert expected in got.message, got.message
    if fault != "break":  # a broken piece's first 50 ms were played, its words told
        assert "Zanzibar" not in got.heard
    assert server.poisoned == 1


async def test_an_unreachable_tts_server_is_an_error_event_not_silence(
    engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    """Nothing can speak, the apology included: the caller is told in
    an error event and a failed response.done, within a bound."""
    llm = make_llm(API, peer.base_url)
    settings = settings_with(llm_prefill=False)
    peer.add(Script(text_events(API, REPLIES[0])))
    try:
        with unused_port() as port:
            tts = remote_tts(f"http://127.0.0.1:{port}/v1")
            served = engine_with_models(engine, settings, llm=llm, tts=tts)
            async with run_server(settings, served) as srv:
                a = await caller(srv, http)
                asked_at = time.monotonic()
                failed = await asyncio.wait_for(ask(a, "Where is Paris?"), 20)
                assert failure_code(failed) == "tts_error"
                (error,) = a.of_type("error")
                assert "the TTS server could not be reached" in error["error"]["message"]
                assert "127.0.0.1" not in error["error"]["message"]  # its address: logged only
                # No sound came, and no words were told as they would have been spoken.
                assert a.received.first_sound_after(asked_at) is None
                assert not a.of_type("response.output_audio_transcript.delta")
                report("remote tts unreachable", asked_to_failed_done=time.monotonic() - asked_at)
                await a.hangup(http)
                await asyncio.wait_for(srv.calls.wait_for_count(0), 5)
    finally:
        await close_quietly(llm)
