"""Semantic end of turn: Smart Turn v3.2 (the real model, from the pipecat-ai
wheel) on real recorded speech, alone and in real WebRTC calls to a server
whose default turn detection is semantic (real STT, a scripted LLM)."""

from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests import conftest
from tests.audio_data import librivox, silence, telephone_prompt
from tests.realtime_events import appended_audio
from tests.scripted_llm import (
    Script,
    ScriptedLlmServer,
    chat_text,
    close_quietly,
    engine_with_llm,
    make_llm,
    scripted_llm_server,
)
from voice_agent.backends.turn_smart import SmartTurn, SmartTurnFeatures, packaged_weights
from voice_agent.client import RealtimeClient
from voice_agent.engine import Engine
from voice_agent.session.endpointing import EAGERNESS

RATE = 16_000
# "Please try your | call again later.": the model hears the voice go on at
# the bar (judged incomplete, p ~0.04 here) and stop at the full stop.
HESITANT = telephone_prompt("please-try-call-later")
HESITATION_AT = int(0.84 * RATE)
FINISHED = telephone_prompt("check-number-dial-again")


def hesitant(pause_s: float) -> np.ndarray:
    """The prompt with a pause of ``pause_s`` where the model hears it go on."""
    return np.concatenate((HESITANT[:HESITATION_AT], silence(pause_s), HESITANT[HESITATION_AT:]))


@pytest.fixture(scope="module")
def model() -> SmartTurn:
    return SmartTurn(packaged_weights())


def test_the_features_are_those_pipecat_computes_for_the_model() -> None:
    # pipecat's own numpy feature code, loaded from its file in the wheel
    # (pipecat's package itself is not importable here: no dependencies).
    path = Path(packaged_weights()).parent.parent / "_whisper_features.py"
    spec = importlib.util.spec_from_file_location("pipecat_whisper_features", path)
    assert spec is not None and spec.loader is not None
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    for audio in (librivox("0930"), np.concatenate([librivox("0870")] * 2)):  # 4 s, 14 s
        last = audio[-8 * RATE :].astype(np.float32) / 32768.0
        window = np.pad(last, (8 * RATE - len(last), 0))
        expected = reference.compute_whisper_log_mel_features(window, do_normalize=True)
        np.testing.assert_allclose(SmartTurnFeatures()(audio), expected, atol=1e-4)


async def test_a_finished_sentence_is_complete_and_a_hesitation_is_not(model: SmartTurn) -> None:
    pause = silence(0.2)
    finished = await model.completion(np.concatenate((FINISHED, pause)))
    unfinished = await model.completion(np.concatenate((HESITANT[:HESITATION_AT], pause)))
    assert finished > 0.8 > 0.2 > unfinished, (finished, unfinished)
    model.close()


async def test_judgements_from_many_sessions_share_the_one_model(model: SmartTurn) -> None:
    model = SmartTurn(packaged_weights(), max_batch=4)
    try:
        turns = [np.concatenate((FINISHED, silence(0.2)))] * 6
        turns += [np.concatenate((HESITANT[:HESITATION_AT], silence(0.2)))] * 6
        verdicts = await asyncio.gather(*(model.completion(t) for t in turns))
        assert all(v > 0.8 for v in verdicts[:6]) and all(v < 0.2 for v in verdicts[6:])
        stats: Any = model.stats()["batching"]
        assert stats["requests"]["final"] == 12
        assert stats["batches"] < 12  # those that arrived together ran together
    finally:
        model.close()


@pytest.fixture
async def peer() -> AsyncIterator[ScriptedLlmServer]:
    async with scripted_llm_server() as server:
        yield server


@pytest.fixture
async def semantic_server(
    engine: Engine, peer: ScriptedLlmServer
) -> AsyncIterator[conftest.RunningServer]:
    """A server with the shipped default: semantic turn detection."""
    llm = make_llm("chat-completions", peer.base_url)
    scripted = engine_with_llm(engine, llm, llm_prefill=False, turn_detection="semantic")
    try:
        async with conftest.run_server(conftest.test_settings(), scripted) as server:
            yield server
    finally:
        await close_quietly(llm)


async def spoken_turns(
    server: conftest.RunningServer,
    http: aiohttp.ClientSession,
    audio: np.ndarray,
    update: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Speak ``audio`` into a new call; the events until the line is quiet."""
    client = RealtimeClient(server.url)
    await client.connect(http)
    created = await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    if update is not None:
        mark = len(client.events)
        client.send({"type": "session.update", "session": update})
        await asyncio.wait_for(client.wait_for_type("session.updated", after=mark), 5)
    for event in appended_audio(audio):
        client.send(event)
    # The last turn is answered: wait for a reply done after its commit,
    # and a second more in case another turn was still being spoken.
    for _ in range(30):
        await asyncio.sleep(1.0)
        commits = [
            i for i, e in enumerate(client.events) if e["type"] == "input_audio_buffer.committed"
        ]
        if not commits:
            continue
        await asyncio.wait_for(client.wait_for_type("response.done", after=commits[-1]), 30)
        await asyncio.sleep(1.0)
        if not any(
            e["type"] == "input_audio_buffer.committed" for e in client.events[commits[-1] + 1 :]
        ):
            break
    else:
        raise AssertionError("the call never went quiet")
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    return [created, *client.events]


async def test_a_finished_sentence_ends_when_the_model_says_so(
    semantic_server: conftest.RunningServer, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    peer.add(Script(chat_text("Done.")))
    events = await spoken_turns(semantic_server, http, np.concatenate((FINISHED, silence(1.5))))
    created = events[0]
    assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    (done,) = [e for e in events if e["type"] == "response.done"]
    metadata = done["response"]["metadata"]
    # Ended by the verdict, not by the silence cap (which is 2 s).
    assert metadata["end_of_turn_decision"] == "model", metadata
    assert metadata["end_of_turn_verdict"] == "complete"
    assert float(metadata["end_of_turn_probability"]) >= EAGERNESS["auto"].threshold


async def test_a_pause_mid_sentence_is_waited_out_with_semantic_turns_only(
    semantic_server: conftest.RunningServer, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    audio = np.concatenate((hesitant(1.0), silence(1.5)))
    for _ in range(3):
        peer.add(Script(chat_text("Yes.")))
    semantic = await spoken_turns(semantic_server, http, audio)
    transcripts = [
        e["transcript"]
        for e in semantic
        if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    assert len(transcripts) == 1, transcripts  # one turn: the whole sentence
    assert "later" in transcripts[0].lower() and "try" in transcripts[0].lower()
    # The same speech with a fixed 500 ms silence: cut at the pause.
    fixed = await spoken_turns(
        semantic_server,
        http,
        audio,
        {"audio": {"input": {"turn_detection": {"type": "server_vad"}}}},
    )
    assert len([e for e in fixed if e["type"] == "input_audio_buffer.committed"]) == 2


class FailingTurnModel:
    """An end-of-turn model that crashes on every judgement."""

    name = "failing"
    semantic = True

    async def completion(self, audio: np.ndarray) -> float:
        raise RuntimeError("the turn model crashed")

    def close(self) -> None:
        pass


class SlowTurnModel:
    """The real model, answering a second late (an overloaded host)."""

    name = "slow"
    semantic = True

    def __init__(self, model: SmartTurn) -> None:
        self._model = model

    async def completion(self, audio: np.ndarray) -> float:
        await asyncio.sleep(1.0)
        return await self._model.completion(audio)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("broken", ["failing", "slow"])
async def test_a_model_that_fails_or_is_late_leaves_the_turn_to_the_silence(
    broken: str,
    engine: Engine,
    model: SmartTurn,
    peer: ScriptedLlmServer,
    http: aiohttp.ClientSession,
) -> None:
    llm = make_llm("chat-completions", peer.base_url)
    scripted = engine_with_llm(engine, llm, llm_prefill=False, turn_detection="semantic")
    assert scripted.models is not None
    turn_model = FailingTurnModel() if broken == "failing" else SlowTurnModel(model)
    scripted.models = replace(scripted.models, turn=turn_model)
    peer.add(Script(chat_text("Done.")))
    try:
        async with conftest.run_server(conftest.test_settings(), scripted) as server:
            events = await spoken_turns(server, http, np.concatenate((FINISHED, silence(1.0))))
    finally:
        await close_quietly(llm)
    (done,) = [e for e in events if e["type"] == "response.done"]
    assert done["response"]["status"] == "completed"
    metadata = done["response"]["metadata"]
    assert metadata["end_of_turn_decision"] == "silence"
    assert metadata["end_of_turn_verdict"] == ("failed" if broken == "failing" else "late")


async def test_four_callers_pausing_at_once_each_keep_their_one_turn(
    semantic_server: conftest.RunningServer, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    """Their judgements meet in the one model, at the same moments."""
    audio = np.concatenate((hesitant(1.0), silence(1.5)))
    for _ in range(8):
        peer.add(Script(chat_text("Yes.")))
    calls = await asyncio.gather(*(spoken_turns(semantic_server, http, audio) for _ in range(4)))
    for events in calls:
        committed = [e for e in events if e["type"] == "input_audio_buffer.committed"]
        (done,) = [e for e in events if e["type"] == "response.done"]
        assert len(committed) == 1
        metadata = done["response"]["metadata"]
        assert metadata["end_of_turn_decision"] == "model", metadata
