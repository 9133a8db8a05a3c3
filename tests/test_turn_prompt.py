"""The prompt a spoken turn is answered with, over a real WebRTC call (real
STT, a scripted LLM server that records every request)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests import conftest
from tests.realtime_events import appended_audio
from voice_agent.backends.base import SttBackend
from voice_agent.backends.capabilities import Transcription
from voice_agent.client import RealtimeClient
from voice_agent.engine import Engine
from voice_agent.testing.audio_data import librivox, silence, with_pause
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    chat_text,
    close_quietly,
    engine_with_llm,
    make_llm,
    scripted_llm_server,
)

pytestmark = pytest.mark.e2e


class SheddingStt:
    """The shared Whisper with every speculative request shed, as when other
    callers' finals wait: each turn is transcribed only once it has ended."""

    def __init__(self, stt: SttBackend) -> None:
        self._stt = stt
        self.shed = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stt, name)

    async def transcribe_speculative(self, audio: np.ndarray) -> str | None:
        self.shed += 1
        return None

    async def transcribe_detailed(
        self, audio: np.ndarray, *, careful: bool = False, speculative: bool = False
    ) -> Transcription | None:
        if speculative:
            self.shed += 1
            return None
        detailed: Transcription | None = await self._stt.transcribe_detailed(  # type: ignore[attr-defined]
            audio, careful=careful
        )
        return detailed


@pytest.fixture
async def peer() -> AsyncIterator[ScriptedLlmServer]:
    async with scripted_llm_server() as server:
        yield server


async def test_a_turn_answered_without_speculation_sends_its_words_once(
    engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    assert engine.models is not None
    stt = SheddingStt(engine.models.stt)
    llm = make_llm("chat-completions", peer.base_url)
    scripted = engine_with_llm(engine, llm, llm_prefill=False)
    scripted.models = replace(engine.models, llm=llm, stt=stt)
    try:
        async with conftest.run_server(conftest.test_settings(), scripted) as server:
            client = RealtimeClient(server.url)
            await client.connect(http)
            await asyncio.wait_for(client.wait_for_type("session.created"), 10)
            for turn in range(2):
                peer.add(Script(chat_text(f"Reply {turn}.")))
                mark = len(client.events)
                done = client.wait_for_type("response.done", after=mark)
                for event in appended_audio(np.concatenate((librivox("0930"), silence(1.0)))):
                    client.send(event)
                assert (await asyncio.wait_for(done, 30))["response"]["status"] == "completed"
            await client.hangup(http)
            await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    finally:
        await close_quietly(llm)
    assert stt.shed >= 2
    first, second = ([(m["role"], m["content"]) for m in b["messages"]] for b in peer.bodies())
    heard = first[-1][1]
    assert "amiable" in heard
    assert [role for role, _ in first] == ["system", "user"]
    # The second turn's prompt: the first exchange, then its own words, once each.
    assert second[1:] == [("user", heard), ("assistant", "Reply 0."), ("user", heard)]


async def test_a_400_ms_pause_mid_sentence_gets_one_reply_to_the_whole_sentence(
    engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    """The pause starts a speculative reply to the words so far; the caller
    speaking on drops it, and the one reply answers the whole sentence."""
    assert engine.models is not None
    peer.script_for = lambda body: Script(chat_text("Reply."))
    llm = make_llm("chat-completions", peer.base_url)
    scripted = engine_with_llm(engine, llm, llm_prefill=False)
    sentence = with_pause(librivox("0870"), 0.4)  # "... how much | there might be ..."
    try:
        async with conftest.run_server(conftest.test_settings(), scripted) as server:
            client = RealtimeClient(server.url)
            await client.connect(http)
            await asyncio.wait_for(client.wait_for_type("session.created"), 10)
            done = client.wait_for_type("response.done")
            for event in appended_audio(np.concatenate((sentence, silence(1.0)))):
                client.send(event)
            assert (await asyncio.wait_for(done, 30))["response"]["status"] == "completed"
            # The audio went faster than real time: a second turn's events
            # would have followed the first reply's within this second.
            await asyncio.sleep(1.0)
            kinds = [event["type"] for event in client.events]
            transcripts = client.of_type("conversation.item.input_audio_transcription.completed")
            await client.hangup(http)
            await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    finally:
        await close_quietly(llm)
    assert kinds.count("input_audio_buffer.committed") == 1
    assert kinds.count("response.created") == kinds.count("response.done") == 1
    assert len(transcripts) == 1
    heard = transcripts[0]["transcript"].lower()
    assert "dashwood" in heard and "prudently" in heard
    # The speculative request for the first half came first, if at all; the
    # reply's own request carried the whole sentence.
    assert peer.bodies()[-1]["messages"][-1]["content"].lower() == heard.strip()
    assert len(peer.bodies()) <= 2
