"""Every spoken turn heard: the checks that distrust a fast transcript
(stages/transcript_check.py), the safe re-decode and the unheard turn
(session/hearing.py), on the real Whisper backend and real recordings."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from tests.conftest import run_server
from tests.conftest import test_settings as settings_with
from tests.stt_fixtures import engine_with_models
from tests.test_faults import API, OTHER_REPLY, apology_heard, caller, failure_code, say, transcript
from tests.transcription_server import API_KEY, transcription_server
from voice_agent.backends import registry
from voice_agent.backends.capabilities import CarefulTranscriber, Transcription
from voice_agent.backends.stt.hosted import HostedStt
from voice_agent.engine import Engine
from voice_agent.server.speech_api import add_speech_routes
from voice_agent.session.hearing import Hearing, HearingStats
from voice_agent.session.session import SessionConfig
from voice_agent.stages.transcript_check import (
    distrust,
    garbled,
    hallucinated,
    has_loop,
    without_loop,
)
from voice_agent.testing.audio_data import (
    ASTERISK,
    goforward,
    librivox,
    reference,
    silence,
    telephone_prompt,
    word_error_rate,
)
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    close_quietly,
    make_llm,
    text_events,
)

SPEECH_MS = 2000  # what the VAD reports for a clearly voiced turn


# -- the checks, on text and evidence ----------------------------------------------
@pytest.mark.parametrize(
    ("text", "loop"),
    [
        ("Please, please, please, please, please, please, please,", True),
        ("Please check the number and dial again Please check the number and dial", True),
        ("You are the one who will be the one who will be the one who will be the", True),
        ("Please enter your agent number followed by the pound key.", False),
        ("No, no, no. I said the blue one.", False),
        ("Go on. Go on and on and on.", False),
        ("Yes, yes, yes, yes, that is right.", False),
        ("I'd like a table for two. Actually, I'd like a table for four.", False),
        ("My number is 0 4 0 4 0 4 1 2.", False),
        ("Ha-ha-ha-ha.", True),
        ("That agent is already logged on. Please enter your agent number.", False),
    ],
)
def test_repetition_loops_are_told_from_ordinary_repeats(text: str, loop: bool) -> None:
    assert has_loop(text) is loop


def test_a_loop_is_cut_where_it_starts_again() -> None:
    assert without_loop("Please, please, please, please, please,") == "Please"
    looped = "Please check the number and dial again Please check the number and dial"
    assert without_loop(looped) == "Please check the number and dial again"
    assert without_loop("Ha-ha-ha-ha.") == "Ha-ha-ha-ha."  # one token, kept whole


@pytest.mark.parametrize(
    ("text", "marks"),
    [
        ("Un-------------", True),
        ("...", True),
        ("No...", False),
        ("OK!", False),
        ("لِلَّهِ", False),
        ("你好", False),
    ],
)
def test_marks_where_words_should_be(text: str, marks: bool) -> None:
    assert garbled(text) is marks


def test_what_is_distrusted_and_why() -> None:
    clear = Transcription("Hello there.", no_speech_prob=0.05, avg_logprob=-0.3)
    assert distrust(clear, SPEECH_MS) is None
    assert distrust(Transcription("", no_speech_prob=0.7), SPEECH_MS) == "no_speech"
    assert distrust(Transcription("", no_speech_prob=0.1), SPEECH_MS) == "empty"
    assert distrust(Transcription(""), 100) is None  # a click: no words expected
    assert distrust(Transcription("Un-------------"), SPEECH_MS) == "garbled"
    assert distrust(Transcription("Please", truncated=True), SPEECH_MS) == "truncated"
    assert distrust(Transcription("Hum drum", avg_logprob=-1.4), SPEECH_MS) == "low_confidence"
    # Words the model believes nobody said, from audio the VAD barely heard,
    # are dropped outright (no safe decode for a cough); from speech they stand.
    invented = Transcription("you", no_speech_prob=0.7)
    assert hallucinated(invented, 100) and not hallucinated(invented, SPEECH_MS)
    assert distrust(invented, SPEECH_MS) is None


# -- the real Whisper backend --------------------------------------------------------
def _whisper(engine: Engine) -> CarefulTranscriber:
    assert engine.models is not None
    stt = engine.models.stt
    assert isinstance(stt, CarefulTranscriber)
    return stt


def _hearing(engine: Engine) -> tuple[Hearing, HearingStats]:
    assert engine.models is not None
    stats = HearingStats()
    return Hearing(engine.models.stt, stats, "test"), stats


@pytest.mark.parametrize("name", sorted(ASTERISK))
async def test_telephone_prompts_are_heard_whole_in_the_trimmed_window(
    engine: Engine, name: str
) -> None:
    """Prompts that the trimmed window once heard as "Please", as a loop of
    "please", as the sentence twice, or as "Un-------------": the padding
    was a hum to Whisper, not silence."""
    fast = await _whisper(engine).transcribe_detailed(telephone_prompt(name))
    assert fast is not None and not fast.careful
    assert distrust(fast, SPEECH_MS) is None, fast
    assert word_error_rate(ASTERISK[name], fast.text) <= 0.2, fast


async def test_a_clear_turn_is_trusted_and_decoded_once(engine: Engine) -> None:
    hearing, stats = _hearing(engine)
    heard = await hearing.final(librivox("0930"), SPEECH_MS, None)
    assert word_error_rate(reference("0930"), heard.text) <= 0.2
    assert heard.distrusted is None and heard.unheard is None
    assert not stats.redecoded and not stats.unheard


def _said_over_and_over() -> np.ndarray:
    """ "Please try" four times, a word and a half cut from a prompt: the
    trimmed window hears it as a loop of "please try" fourteen times."""
    return np.concatenate([telephone_prompt("please-try-call-later")[: int(0.65 * 16000)]] * 4)


async def test_a_repetition_loop_is_decoded_again_and_never_answered_as_a_loop(
    engine: Engine,
) -> None:
    audio = _said_over_and_over()
    hearing, stats = _hearing(engine)
    fast = await _whisper(engine).transcribe_detailed(audio)
    assert fast is not None and has_loop(fast.text), fast
    heard = await hearing.final(audio, SPEECH_MS, None)
    assert heard.distrusted == "repetition" and stats.redecoded == {"repetition": 1}
    # The safe decode hears it right, or loops too and is cut at its start.
    assert not has_loop(heard.text), heard
    assert heard.text.lower().startswith("please try"), heard


async def test_voiced_audio_with_no_words_even_the_safe_way_is_unheard(engine: Engine) -> None:
    """The VAD called it speech (a hum it mistook, say); Whisper hears
    nobody, fast and safe: the turn is unheard, not silently dropped."""
    hearing, stats = _hearing(engine)
    heard = await hearing.final(silence(2.0), SPEECH_MS, None)
    assert heard.text == "" and heard.unheard == "no_speech"
    assert stats.redecoded == {"no_speech": 1} and stats.unheard == {"no_speech": 1}


async def test_a_short_noise_is_neither_words_nor_unheard(engine: Engine) -> None:
    noise = np.random.default_rng(7).normal(0, 300, 16000).astype(np.int16)
    hearing, stats = _hearing(engine)
    heard = await hearing.final(noise, 100, None)
    assert heard.text == "" and heard.unheard is None
    assert not stats.redecoded and not stats.unheard


async def test_a_distrusted_speculation_is_decoded_again_by_the_final(engine: Engine) -> None:
    hearing, stats = _hearing(engine)
    audio = _said_over_and_over()
    early = await hearing.speculate(audio, SPEECH_MS)
    assert early is not None and not early.settled and early.distrusted == "repetition"
    assert not stats.redecoded  # a speculation never pays for the safe decode
    # Never answered from, but read at the pause (a dangling last word keeps
    # the turn open): the loop is cut where it starts again.
    assert early.text.lower().startswith("please try") and not has_loop(early.text), early
    heard = await hearing.final(audio, SPEECH_MS, early)
    assert heard.settled and stats.redecoded == {"repetition": 1}
    settled = await hearing.speculate(librivox("0930"), SPEECH_MS)
    assert settled is not None and settled.settled
    assert await hearing.final(librivox("0930"), SPEECH_MS, settled) is settled


# -- in a real call --------------------------------------------------------------------
@pytest.mark.e2e
@pytest.mark.slow
async def test_a_turn_with_no_words_is_never_dropped_in_silence(
    engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    """A remote STT (a real server around the real Whisper) answers no words
    for the clearly spoken "go forward ten meters": the client is told the
    transcription failed and why, the caller hears the clarification, it is
    counted, and the caller's next turn is heard and answered."""
    assert engine.models is not None
    async with transcription_server(engine.models.stt) as (remote, url):
        remote.poison, remote.poison_reply = "forward", "empty"
        stt = registry.create(
            "stt",
            "openai",
            settings_with(stt="openai", stt_base_url=url + "/v1", stt_api_key=API_KEY),
        )
        llm = make_llm(API, peer.base_url)
        settings = settings_with(llm_prefill=False)
        served = engine_with_models(engine, settings, stt=stt, llm=llm)
        peer.add(*(Script(text_events(API, OTHER_REPLY)) for _ in range(4)))
        try:
            async with run_server(settings, served) as server:
                client = await caller(server, http)
                response = await asyncio.wait_for(say(client, goforward()), 30)
                assert failure_code(response) == "speech_not_recognized"
                clarification = SessionConfig.clarification
                assert transcript(response) == clarification
                assert apology_heard(client, clarification)
                (failed,) = client.of_type("conversation.item.input_audio_transcription.failed")
                assert failed["error"]["code"] == "speech_not_recognized"
                assert "empty" in failed["error"]["message"]
                assert not client.of_type("conversation.item.input_audio_transcription.completed")
                assert remote.poisoned >= 1
                async with http.get(server.url + "/metrics") as reply:
                    exposition = await reply.text()
                assert 'voice_agent_turns_unheard_total{reason="empty"}' in exposition
                again = await asyncio.wait_for(say(client, librivox("0890")), 30)
                assert again["status"] == "completed", again
                heard = client.of_type("conversation.item.input_audio_transcription.completed")
                assert word_error_rate(reference("0890"), heard[-1]["transcript"]) <= 0.2
                await client.hangup(http)
                await asyncio.wait_for(server.calls.wait_for_count(0), 5)
        finally:
            await close_quietly(llm)
            await close_quietly(stt)


@pytest.mark.e2e
async def test_media_workers_get_the_evidence_and_the_safe_decode_from_the_model_process(
    engine: Engine, tmp_path: Path
) -> None:
    """With --workers, the sessions reach Whisper through the model
    process's speech API: its transcripts carry the evidence, and the safe
    decode is asked for there."""
    assert engine.models is not None
    speech = web.Application()
    add_speech_routes(speech, engine.models.stt, engine.models.tts)
    runner = web.AppRunner(speech)
    await runner.setup()
    socket = str(tmp_path / "speech.sock")
    await web.UnixSite(runner, socket).start()
    hosted = HostedStt(socket, 0, 30.0)
    try:
        assert isinstance(hosted, CarefulTranscriber)
        prompt = telephone_prompt("please-try-call-later")
        fast = await hosted.transcribe_detailed(prompt)
        assert fast is not None and not fast.careful and fast.no_speech_prob is not None
        assert word_error_rate(ASTERISK["please-try-call-later"], fast.text) <= 0.2
        careful = await hosted.transcribe_detailed(prompt, careful=True)
        assert careful is not None and careful.careful
        stats = HearingStats()
        heard = await Hearing(hosted, stats, "test").final(silence(2.0), SPEECH_MS, None)
        assert heard.unheard == "no_speech" and stats.redecoded == {"no_speech": 1}
    finally:
        await hosted.aclose()
        await runner.cleanup()


class SafeDecodeFailing:
    """The real Whisper backend whose safe decode fails (a model process
    gone, say), as a fault stands in front of a real model."""

    def __init__(self, stt: CarefulTranscriber) -> None:
        self._stt = stt
        self.name = "failing-safe-decode"
        self.failed = 0

    async def transcribe(self, audio: np.ndarray) -> str:
        result = await self._stt.transcribe_detailed(audio)
        assert result is not None
        return result.text

    async def transcribe_detailed(
        self, audio: np.ndarray, *, careful: bool = False, speculative: bool = False
    ) -> Transcription | None:
        if careful:
            self.failed += 1
            raise RuntimeError("the model process went away")
        return await self._stt.transcribe_detailed(audio, speculative=speculative)

    def close(self) -> None:
        pass


async def test_a_failed_safe_decode_leaves_the_fast_words(engine: Engine) -> None:
    failing = SafeDecodeFailing(_whisper(engine))
    stats = HearingStats()
    heard = await Hearing(failing, stats, "test").final(_said_over_and_over(), SPEECH_MS, None)
    assert failing.failed == 1 and heard.distrusted == "repetition"
    # The loop is still never answered as one: cut where it starts again.
    assert heard.text.lower().startswith("please try") and not has_loop(heard.text)
    assert stats.loops_cut == 1
