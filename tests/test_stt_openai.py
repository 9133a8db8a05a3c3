"""The remote STT backend against a real HTTP server speaking OpenAI's
``/v1/audio/transcriptions`` wire format, which runs the tiny NeMo model."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from tests.conftest import run_server
from tests.conftest import test_settings as settings_with
from tests.stt_fixtures import engine_with_stt
from tests.transcription_server import API_KEY, TranscriptionServer, transcription_server
from voice_agent.backends import registry
from voice_agent.backends.base import SttBackend
from voice_agent.backends.stt.hosted import OpenAIStt, RemoteSttError
from voice_agent.client import RealtimeClient
from voice_agent.engine import Engine
from voice_agent.testing.audio_data import silence
from voice_agent.testing.tiny_nemo import phrase_audio


@pytest_asyncio.fixture
async def remote(parakeet: SttBackend) -> AsyncIterator[tuple[TranscriptionServer, str]]:
    async with transcription_server(parakeet) as served:
        yield served


_clients: list[OpenAIStt] = []


@pytest_asyncio.fixture(autouse=True)
async def close_clients() -> AsyncIterator[None]:
    """Each test's clients close their connection pools afterwards."""
    yield
    while _clients:
        await _clients.pop().aclose()


def remote_stt(base_url: str, **overrides: Any) -> OpenAIStt:
    values: dict[str, Any] = {
        "stt": "openai",
        "stt_base_url": base_url,
        "stt_api_key": API_KEY,
        "stt_model": "tiny-ctc",
    }
    values.update(overrides)
    stt = registry.create("stt", "openai", settings_with(**values))
    assert isinstance(stt, OpenAIStt)
    _clients.append(stt)
    return stt


async def test_transcribes_through_the_remote_server(
    remote: tuple[TranscriptionServer, str],
) -> None:
    server, url = remote
    stt = remote_stt(url + "/v1")
    assert await stt.transcribe(phrase_audio("goforward")) == "go forward ten meters"
    (form,) = server.forms
    assert form["model"] == "tiny-ctc" and form["language"] == "en"
    assert form["response_format"] == "json"
    stats = stt.stats()
    assert stats["errors"] == 0
    assert isinstance(stats["requests"], dict) and stats["requests"]["count"] == 1


async def test_a_webrtc_call_transcribed_remotely(
    engine: Engine, remote: tuple[TranscriptionServer, str], http: aiohttp.ClientSession
) -> None:
    _, url = remote
    settings = settings_with(
        stt="openai", stt_base_url=url + "/v1", stt_api_key=API_KEY, stt_model="tiny-ctc"
    )
    stt = registry.create("stt", "openai", settings)
    _clients.append(stt)
    async with run_server(settings, engine_with_stt(engine, stt, settings)) as server:
        client = RealtimeClient(server.url)
        await client.connect(http)
        done = client.wait_for_type("conversation.item.input_audio_transcription.completed")
        audio = np.concatenate((silence(0.3), phrase_audio("goforward"), silence(0.8)))
        await client.mic.play(audio, 16000)
        assert (await asyncio.wait_for(done, 60))["transcript"] == "go forward ten meters"
        # Remote STT is off for partials by default (each would be billed).
        assert not client.of_type("conversation.item.input_audio_transcription.delta")
        await client.hangup(http)


async def test_errors_say_what_went_wrong(remote: tuple[TranscriptionServer, str]) -> None:
    server, url = remote
    with pytest.raises(RemoteSttError, match=r"answered 401: .*invalid api key"):
        await remote_stt(url + "/v1", stt_api_key="wrong").transcribe(silence(1))
    with pytest.raises(RemoteSttError, match=r"sent no transcript"):
        await remote_stt(url + "/broken").transcribe(silence(1))
    server.stall.clear()
    with pytest.raises(RemoteSttError, match=r"no answer within 0.3 s"):
        await remote_stt(url + "/v1", stt_timeout_s=0.3).transcribe(silence(1))


async def test_utterances_share_one_kept_alive_connection_until_closed(
    remote: tuple[TranscriptionServer, str],
) -> None:
    server, url = remote
    stt = remote_stt(url + "/v1")
    for _ in range(3):
        assert await stt.transcribe(phrase_audio("goforward")) == "go forward ten meters"
    assert len(server.peers) == 3 and len(set(server.peers)) == 1, server.peers
    await stt.aclose()
    with pytest.raises(RemoteSttError, match="is closed"):
        await stt.transcribe(silence(1))


async def test_a_body_that_is_not_utf8_is_quoted_in_the_error(
    remote: tuple[TranscriptionServer, str],
) -> None:
    _, url = remote
    with pytest.raises(RemoteSttError, match=r"answered 502: Passerelle d\ufffdfaillante"):
        await remote_stt(url + "/latin1").transcribe(silence(1))


@contextlib.contextmanager
def unused_port() -> Iterator[int]:
    """A local port nobody accepts connections on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


async def test_an_unreachable_server_is_a_clear_error() -> None:
    with unused_port() as port:
        stt = remote_stt(f"http://127.0.0.1:{port}/v1")
        with pytest.raises(RemoteSttError, match=r"cannot reach STT server http://127.0.0.1"):
            await stt.transcribe(silence(1))


async def test_start_up_sends_the_remote_server_nothing(
    remote: tuple[TranscriptionServer, str],
) -> None:
    # A warm-up request would be billed (and, with a wrong key or a server
    # that is down, would stop the service from starting).
    server, url = remote
    settings = settings_with(
        stt="openai",
        stt_base_url=url + "/v1",
        stt_api_key="wrong",
        llm_base_url=url + "/llm/v1",  # remote: no prefill request either
    )
    engine = Engine(settings)
    try:
        await engine.start()
        assert engine.ready
    finally:
        await engine.stop()
    assert server.requests == 0


async def test_the_api_key_defaults_to_openai_api_key(
    remote: tuple[TranscriptionServer, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, url = remote
    monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
    stt = remote_stt(url + "/v1", stt_api_key=None)
    assert await stt.transcribe(phrase_audio("goforward")) == "go forward ten meters"


def test_a_base_url_is_required() -> None:
    with pytest.raises(registry.BackendUnavailable, match="needs --stt-base-url"):
        registry.create("stt", "openai", settings_with(stt="openai"))
