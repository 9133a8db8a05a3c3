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
from tests.scripted_call import peer
from voice_agent.backends.base import WordsBackend
from voice_agent.backends.turn.smart_turn import SmartTurn, SmartTurnFeatures, packaged_weights
from voice_agent.client import RealtimeClient
from voice_agent.engine import Engine
from voice_agent.rtc.outbound import PacedAudioTrack
from voice_agent.session.endpointing import EAGERNESS, words_unfinished
from voice_agent.session.events import UserTurnCommitted
from voice_agent.session.session import VoiceSession
from voice_agent.testing.audio_data import librivox, silence, telephone_prompt
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    chat_text,
    close_quietly,
    engine_with_llm,
    make_llm,
)
from voice_agent.testing.waiting import until

__all__ = ["peer"]  # the fixture
RATE = 16_000
# "Please try your | call again later.": the model hears the voice go on at
# the bar (judged incomplete, p ~0.04 here) and stop at the full stop.
HESITANT = telephone_prompt("please-try-call-later")
HESITATION_AT = int(0.84 * RATE)
FINISHED = telephone_prompt("check-number-dial-again")
# "Please enter the number to be | blacklisted": a clause the model may
# hear as finished, whose words are not.
DANGLING = telephone_prompt("enter-num-blacklist")
DANGLING_AT = int(1.28 * RATE)


def hesitant(pause_s: float) -> np.ndarray:
    """The prompt with a pause of ``pause_s`` where the model hears it go on."""
    return np.concatenate((HESITANT[:HESITATION_AT], silence(pause_s), HESITANT[HESITATION_AT:]))


@pytest.fixture
async def model() -> AsyncIterator[SmartTurn]:
    model = SmartTurn(packaged_weights())
    yield model
    model.close()


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


@pytest.mark.models
async def test_a_finished_sentence_is_complete_and_a_hesitation_is_not(model: SmartTurn) -> None:
    pause = silence(0.2)
    finished = await model.completion(np.concatenate((FINISHED, pause)))
    unfinished = await model.completion(np.concatenate((HESITANT[:HESITATION_AT], pause)))
    assert finished > 0.8 > 0.2 > unfinished, (finished, unfinished)


@pytest.mark.models
async def test_judgements_from_many_sessions_share_the_one_model() -> None:
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
    """Speak ``audio`` into a new call, in real time over its media track;
    the events until the line is quiet."""
    client = RealtimeClient(server.url)
    await client.connect(http)
    created = await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    if update is not None:
        mark = len(client.events)
        client.send({"type": "session.update", "session": update})
        await asyncio.wait_for(client.wait_for_type("session.updated", after=mark), 5)
    await client.mic.play(audio, RATE)
    # The last turn is answered: wait for a reply done after its commit,
    # and a second more in case another turn was still being spoken.
    await asyncio.wait_for(client.wait_for_type("input_audio_buffer.committed"), 30)
    for _ in range(30):
        commits = [
            i for i, e in enumerate(client.events) if e["type"] == "input_audio_buffer.committed"
        ]
        await asyncio.wait_for(client.wait_for_type("response.done", after=commits[-1]), 30)
        await asyncio.sleep(1.0)  # real time: a quiet second, or another turn's commit
        if not any(
            e["type"] == "input_audio_buffer.committed" for e in client.events[commits[-1] + 1 :]
        ):
            break
    else:
        raise AssertionError("the call never went quiet")
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    return [created, *client.events]


@pytest.mark.slow
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


@pytest.mark.slow
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
@pytest.mark.slow
async def test_a_failing_model_leaves_the_turn_to_the_silence_a_late_one_is_awaited(
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
    if broken == "failing":
        assert metadata["end_of_turn_decision"] == "silence"
        assert metadata["end_of_turn_verdict"] == "failed"
    else:  # a second late, within the cap: its verdict still ends the finished sentence
        assert metadata["end_of_turn_decision"] == "model", metadata
        assert metadata["end_of_turn_verdict"] == "complete", metadata
        assert float(metadata["end_of_turn_inference_ms"]) >= 1000


@pytest.mark.slow
async def test_four_callers_pausing_at_once_each_keep_their_one_turn(
    semantic_server: conftest.RunningServer, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    """Their judgements meet in the one model, at the same moments (on a
    loaded 2-core host some miss the timeout: they are still awaited)."""
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


class SureTurnModel:
    """An end-of-turn model that hears every pause as the end of the turn."""

    name = "sure"
    semantic = True

    async def completion(self, audio: np.ndarray) -> float:
        return 0.99

    def close(self) -> None:
        pass


def test_the_words_that_leave_a_sentence_unfinished() -> None:
    for said in ("My number is", "Please try your.", "I'd like to, um", "Send it to the...",
                 "It would be", "Well,", "Two tickets for"):  # fmt: skip
        assert words_unfinished(said), said
    for said in ("", "Call me back later.", "What is it?", "Come in.", "Thank you", "Is it?",
                 "That's all there is to it", "Where are you from?", "Look at it!"):  # fmt: skip
        assert not words_unfinished(said), said


@pytest.mark.slow
async def test_a_complete_verdict_on_a_dangling_word_is_overruled_in_a_real_call(
    engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    """A model sure of every pause, and "Please enter the number to be ...
    blacklisted": the early transcript of the pause ("... to be") keeps the
    turn open, so the caller is not talked over."""
    llm = make_llm("chat-completions", peer.base_url)
    scripted = engine_with_llm(engine, llm, llm_prefill=False, turn_detection="semantic")
    assert scripted.models is not None
    scripted.models = replace(scripted.models, turn=SureTurnModel())
    for _ in range(3):
        peer.add(Script(chat_text("Yes.")))
    try:
        async with conftest.run_server(conftest.test_settings(), scripted) as server:
            audio = (DANGLING[:DANGLING_AT], silence(1.0), DANGLING[DANGLING_AT:], silence(1.5))
            events = await spoken_turns(server, http, np.concatenate(audio))
    finally:
        await close_quietly(llm)
    transcripts = [
        e["transcript"]
        for e in events
        if e["type"] == "conversation.item.input_audio_transcription.completed"
    ]
    assert len(transcripts) == 1 and "black" in transcripts[0].lower(), [
        {k: v for k, v in e["response"]["metadata"].items() if "end_of_turn" in k}
        for e in events
        if e["type"] == "response.done"
    ]
    (done,) = [e for e in events if e["type"] == "response.done"]
    metadata = done["response"]["metadata"]
    assert metadata["end_of_turn_decision"] == "model", metadata  # at the true end


class GatedTurnModel:
    """An end-of-turn model whose verdicts the test releases, to put them
    exactly where a race would (the session logic is what is tested)."""

    name = "gated"
    semantic = True

    def __init__(self) -> None:
        self.asked = 0
        self.waiting = 0  # judgements inside completion() (at the gate, or leaving it)
        self.gate = asyncio.Event()
        self.probability = 0.99

    async def completion(self, audio: np.ndarray) -> float:
        self.asked += 1
        self.waiting += 1
        try:
            await self.gate.wait()
            return self.probability
        finally:
            self.waiting -= 1

    def close(self) -> None:
        pass


class Listener:
    """A session with the gated model, fed audio by hand; its events kept.
    No words judge unless one is given: the model's verdicts alone decide."""

    def __init__(self, engine: Engine, words: WordsBackend | None = None) -> None:
        assert engine.models is not None
        self.model = GatedTurnModel()
        self.events: list[Any] = []
        self._ended = asyncio.Event()
        config = replace(engine.session_config(), semantic=EAGERNESS["auto"])
        models = replace(engine.models, turn=self.model, words=words)
        self.session = VoiceSession(models, config, PacedAudioTrack(), self._on_event)
        # Turns only: no replies, so only the turn-taking is at work.
        detection = self.session.turn_detection
        assert detection is not None and detection.semantic is not None
        self.session.set_turn_detection(replace(detection, create_response=False))

    async def say(self, audio: np.ndarray) -> None:
        self.session.push_audio(audio, from_track=False)
        # A judgement this asked for has reached the model (held at its gate,
        # or, once released, answered and applied); one it cancelled has left.
        await until(lambda: self._judging() == bool(self.model.waiting))

    def _judging(self) -> bool:
        """Whether the session's judge has a judgement in flight: it lets it
        go in the step that applies its verdict."""
        judge = self.session._judge
        return judge is not None and judge._task is not None

    def _on_event(self, event: Any) -> None:
        self.events.append(event)
        if isinstance(event, UserTurnCommitted):
            self._ended.set()

    def ended(self) -> list[UserTurnCommitted]:
        return [e for e in self.events if isinstance(e, UserTurnCommitted)]

    async def until_ended(self, count: int) -> None:
        """A "complete" ends the turn once the pause's words are in (real
        STT, wall-clock time): wait for them, 10 s at most."""
        async with asyncio.timeout(10):
            while len(self.ended()) < count:
                self._ended.clear()
                await self._ended.wait()

    async def words_heard(self) -> None:
        """The pause's early transcript is in, and the session has taken it:
        its done-callback was added first, so it has run by the time this
        wait's own one does."""
        speculation = self.session._speculation
        assert speculation is not None
        done, _ = await asyncio.wait([speculation.stt_task], timeout=10)
        assert done, "the pause's words never came"

    async def release(self) -> None:
        """Let the model answer; returns once its verdict has been applied."""
        self.model.gate.set()
        await until(lambda: not self._judging() and not self.model.waiting)


@pytest.fixture
async def listener(engine: Engine) -> AsyncIterator[Listener]:
    listener = Listener(engine)
    yield listener
    await listener.session.close()


async def test_a_verdict_on_a_pause_the_caller_broke_is_dropped(listener: Listener) -> None:
    await listener.say(np.concatenate((FINISHED, silence(0.3))))
    assert listener.model.asked == 1
    await listener.say(FINISHED[: RATE // 2])  # speaking again before the verdict came
    await listener.release()
    assert listener.ended() == []  # "complete" was about the pause before
    await listener.say(silence(0.3))  # the next pause: judged again, complete
    await listener.release()
    await listener.until_ended(1)
    assert len(listener.ended()) == 1 and listener.model.asked == 2


async def test_a_complete_verdict_waits_for_the_words_and_they_can_overrule_it(
    engine: Engine, listener: Listener
) -> None:
    overruled = engine.end_of_turn.decisions["unfinished"]
    # "Please enter the number to be": the model is sure it is over; the words are not.
    await listener.say(np.concatenate((DANGLING[:DANGLING_AT], silence(0.3))))
    await listener.release()
    await listener.words_heard()
    assert listener.ended() == []
    assert engine.end_of_turn.decisions["unfinished"] == overruled + 1
    await listener.say(silence(1.5))
    assert listener.ended() == []  # 1.8 s: under the 2 s cap
    await listener.say(silence(0.3))
    assert len(listener.ended()) == 1
    # A finished sentence: the same verdict ends the turn once its words are in.
    await listener.say(np.concatenate((FINISHED, silence(0.3))))
    await listener.until_ended(2)


async def test_an_incomplete_verdict_leaves_the_turn_to_the_cap(listener: Listener) -> None:
    listener.model.probability = 0.05
    await listener.say(np.concatenate((FINISHED, silence(0.3))))
    await listener.release()
    await listener.say(silence(1.5))
    assert listener.ended() == []  # 1.8 s of silence: still under the 2 s cap
    await listener.say(silence(0.3))
    assert len(listener.ended()) == 1


async def test_a_verdict_for_settings_since_changed_is_dropped(listener: Listener) -> None:
    await listener.say(np.concatenate((FINISHED, silence(0.3))))
    detection = listener.session.turn_detection
    assert detection is not None
    listener.session.set_turn_detection(replace(detection, semantic=None))  # server_vad
    await listener.release()
    assert listener.ended() == []  # the model no longer decides
    await listener.say(silence(0.3))  # the fixed 500 ms silence does
    assert len(listener.ended()) == 1


async def test_a_commit_while_the_model_judges_ends_the_turn_once(listener: Listener) -> None:
    await listener.say(np.concatenate((FINISHED, silence(0.3))))
    assert listener.session.commit_input() is not None
    await listener.release()
    await listener.say(silence(2.5))
    assert len(listener.ended()) == 1
