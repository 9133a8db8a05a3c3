"""Parakeet (NeMo) STT with the tiny test model: through real WebRTC calls,
batched across concurrent sessions, with live partial transcripts."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests.conftest import RunningServer, run_server, serve_refusing_to_start
from tests.conftest import test_settings as settings_with
from tests.stt_fixtures import engine_with_stt, load_stt, parakeet_settings
from voice_agent.backends import registry
from voice_agent.backends.base import SttBackend
from voice_agent.backends.capabilities import CarefulTranscriber
from voice_agent.backends.stt.parakeet import ParakeetStt
from voice_agent.client import RealtimeClient
from voice_agent.engine import Engine
from voice_agent.session.events import SessionEvent, UserTranscript, UserTranscriptDelta
from voice_agent.session.hearing import Hearing, HearingStats
from voice_agent.session.session import VoiceSession
from voice_agent.testing.audio_data import silence
from voice_agent.testing.tiny_nemo import PHRASES, build_untrained_transducer, phrase_audio

pytestmark = [pytest.mark.e2e, pytest.mark.models]

TRANSCRIPT_DONE = "conversation.item.input_audio_transcription.completed"
TRANSCRIPT_DELTA = "conversation.item.input_audio_transcription.delta"


async def say(server: RunningServer, http: aiohttp.ClientSession, audio: np.ndarray) -> str:
    """One call: speak, wait for the transcript, hang up."""
    client = RealtimeClient(server.url)
    await client.connect(http)
    try:
        done = client.wait_for_type(TRANSCRIPT_DONE)
        await client.mic.play(np.concatenate((silence(0.3), audio, silence(0.8))), 16000)
        event = await asyncio.wait_for(done, 60)
        return str(event["transcript"])
    finally:
        await client.hangup(http)


async def stats(server: RunningServer, http: aiohttp.ClientSession) -> dict[str, Any]:
    async with http.get(server.url + "/v1/stats") as response:
        assert response.status == 200
        body: dict[str, Any] = await response.json()
        return body


async def test_exact_transcript_through_a_webrtc_call(
    parakeet_server: RunningServer, http: aiohttp.ClientSession
) -> None:
    assert await say(parakeet_server, http, phrase_audio("goforward")) == "go forward ten meters"
    body = await stats(parakeet_server, http)
    stt = body["stt"]
    assert stt["backend"] == "parakeet" and stt["device"] == "cpu"
    # The turn's transcript came from its final request, or from the
    # speculative one made at the pause (the same low priority as partials).
    assert stt["batches"] >= 1 and stt["requests"]["final"] + stt["requests"]["partial"] >= 1
    assert stt["inference"]["count"] >= 1 and stt["inference"]["max_ms"] > 0
    await asyncio.wait_for(parakeet_server.calls.wait_for_count(0), 5)


async def test_concurrent_sessions_are_batched_and_get_the_same_transcripts(
    engine: Engine, tiny_nemo_model: Path, http: aiohttp.ClientSession
) -> None:
    # A fresh backend, so its counters are this test's; a generous batch wait
    # makes batching certain even on a slow machine.
    settings = parakeet_settings(
        tiny_nemo_model, stt_batch_wait_ms=300, stt_partial_interval_ms=0, max_calls=8
    )
    stt = await load_stt(settings)
    try:
        async with run_server(settings, engine_with_stt(engine, stt, settings)) as server:
            phrases = [PHRASES[i % 2][0] for i in range(8)]
            alone = [await say(server, http, phrase_audio(name)) for name in phrases[:2]]
            together = await asyncio.gather(
                *(say(server, http, phrase_audio(name)) for name in phrases)
            )
            body = await stats(server, http)
    finally:
        stt.close()
    assert alone == [text for _, text in PHRASES]
    assert together == [alone[i % 2] for i in range(8)]
    sizes = {int(size): n for size, n in body["stt"]["batch_sizes"].items()}
    assert max(sizes) > 1, sizes
    assert body["stt"]["queue_wait"]["count"] >= 10


async def test_partial_transcripts_arrive_while_speaking(
    engine: Engine, parakeet: SttBackend, tiny_nemo_model: Path, http: aiohttp.ClientSession
) -> None:
    # A long end-of-turn silence: the hypotheses of a slow machine still get
    # to agree (settle) before speech_stopped, the moment under test.
    settings = parakeet_settings(tiny_nemo_model, turn_silence_ms=1500)
    async with run_server(settings, engine_with_stt(engine, parakeet, settings)) as server:
        client = RealtimeClient(server.url)
        await client.connect(http)
        done = client.wait_for_type(TRANSCRIPT_DONE)
        audio = np.concatenate((silence(0.3), phrase_audio("0880"), silence(2.0)))
        await client.mic.play(audio, 16000)
        final = await asyncio.wait_for(done, 60)
        kinds = [e["type"] for e in client.events]
        deltas = client.of_type(TRANSCRIPT_DELTA)
        assert deltas, "no partial transcript"
        assert kinds.index(TRANSCRIPT_DELTA) < kinds.index("input_audio_buffer.speech_stopped")
        assert max(i for i, k in enumerate(kinds) if k == TRANSCRIPT_DELTA) < kinds.index(
            TRANSCRIPT_DONE
        )
        assert all(d["item_id"] == final["item_id"] and d["content_index"] == 0 for d in deltas)
        # Only settled words are sent, append-only: here they are the final's start.
        partial = "".join(d["delta"] for d in deltas).split()
        assert partial == final["transcript"].split()[: len(partial)]
        body = await stats(server, http)
        (session,) = body["stt"]["sessions"]
        assert session["partial"]["count"] >= 1 and session["final"]["count"] == 1
        await client.hangup(http)


class ObservedParakeet(ParakeetStt):
    """Says when its first request for a turn (final, or speculative at the
    pause) has been queued."""

    submitted: asyncio.Event

    async def transcribe(self, audio: np.ndarray) -> str:
        # Set before queueing, but queueing does not yield: once a waiter
        # wakes up the request is in the queue.
        self.submitted.set()
        return await super().transcribe(audio)

    async def transcribe_speculative(self, audio: np.ndarray) -> str | None:
        self.submitted.set()
        return await super().transcribe_speculative(audio)


async def test_a_request_cancelled_while_queued_never_reaches_the_model(
    engine: Engine, tiny_nemo_model: Path
) -> None:
    # Requests wait 5 s for company (more than the settings allow), so the
    # session closes while they queue.
    stt = await asyncio.to_thread(ObservedParakeet, str(tiny_nemo_model), "cpu", 2, 8, 5000)
    stt.submitted = asyncio.Event()
    settings = parakeet_settings(tiny_nemo_model)
    events: list[SessionEvent] = []
    shared = engine_with_stt(engine, stt, settings)
    assert shared.models is not None
    session = VoiceSession(shared.models, shared.session_config(), _NoOutput(), events.append)

    def requests() -> dict[str, int]:
        counts = stt.stats()["requests"]
        assert isinstance(counts, dict)
        return counts

    try:
        audio = np.concatenate((silence(0.3), phrase_audio("goforward"), silence(1.0)))
        for start in range(0, len(audio), 320):
            session.push_audio(audio[start : start + 320])
        await asyncio.wait_for(stt.submitted.wait(), 10)
        assert requests()["final"] + requests()["partial"] >= 1
        await session.close()  # waits for its tasks: their requests are withdrawn
        assert requests()["cancelled"] >= 1
        # A request made now waits out the same 5 s batch window: the one
        # batch that runs holds it alone.
        assert await stt.transcribe(phrase_audio("goforward")) == "go forward ten meters"
        assert stt.stats()["batch_sizes"] == {"1": 1}
        assert not [e for e in events if isinstance(e, UserTranscript | UserTranscriptDelta)]
    finally:
        stt.close()


async def test_a_partial_of_a_long_turn_is_skipped_without_reaching_the_model(
    parakeet: SttBackend,
) -> None:
    # Each partial re-transcribes the turn so far: past --stt-partial-max-s
    # (8 s by default) it is refused, so a final never waits behind long ones.
    assert isinstance(parakeet, ParakeetStt)
    speech = phrase_audio("goforward")
    before = parakeet.stats()
    assert await parakeet.transcribe_partial(np.concatenate((speech, silence(6.0)))) is None
    after = parakeet.stats()
    skipped = before["partial_too_long"]
    assert isinstance(skipped, int) and after["partial_too_long"] == skipped + 1
    assert after["requests"] == before["requests"] and after["batches"] == before["batches"]
    # A shorter turn still gets its partial.
    assert await parakeet.transcribe_partial(speech) == "go forward ten meters"


class _NoOutput:
    """Assistant audio goes nowhere: this test is about the user's side."""

    async def write(self, samples: np.ndarray, tag: Any = None) -> None:
        pass

    async def finish(self) -> None:
        pass

    async def drain(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def pause(self) -> None:
        pass

    def resume(self) -> None:
        pass


@pytest.mark.parametrize("kind", ["rnnt", "tdt"])
async def test_transducer_models_give_one_text_per_utterance(kind: str, tmp_path: Path) -> None:
    model = await asyncio.to_thread(build_untrained_transducer, tmp_path, kind)
    stt = await load_stt(parakeet_settings(model))
    try:
        assert isinstance(stt, ParakeetStt)
        decoding = stt._model.cfg.decoding
        assert decoding.get("model_type", "rnnt") == kind
        # Random weights, so the words are nonsense: what is checked is that
        # NeMo's Hypothesis objects become one string per utterance, in order,
        # for a batch of different lengths (one too short to decode).
        noise = np.random.default_rng(0).normal(0, 3000, 3 * 16000).astype(np.int16)
        batch = [noise, silence(0.05), noise[:16000], phrase_audio("goforward")]
        texts = await asyncio.to_thread(stt._transcribe_batch, batch)
        assert isinstance(texts, list) and len(texts) == len(batch)
        assert all(isinstance(text, str) for text in texts) and texts[1] == ""
        # And one by one through the batching worker (random weights: the
        # text may differ with padding, so only its form is checked).
        alone = [await stt.transcribe(audio) for audio in batch]
        assert all(isinstance(text, str) for text in alone) and alone[1] == ""
    finally:
        stt.close()


def test_a_missing_model_file_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "parakeet-tdt-0.6b-v2.nemo"
    with pytest.raises(registry.BackendUnavailable) as error:
        registry.create("stt", "parakeet", parakeet_settings(missing))
    message = str(error.value)
    assert str(missing) in message and "does not exist" in message
    assert "--stt-model /path/to/model.nemo" in message and "huggingface-cli download" in message


def test_an_uncached_pretrained_name_fails_without_downloading(tmp_path: Path) -> None:
    settings = parakeet_settings(Path("nvidia/no-such-parakeet"))
    with pytest.raises(registry.BackendUnavailable) as error:
        registry.create("stt", "parakeet", settings)
    message = str(error.value)
    assert "'nvidia/no-such-parakeet'" in message and "local Hugging Face cache" in message
    assert "huggingface-cli download nvidia/no-such-parakeet" in message


async def test_a_nemo_pretrained_name_is_found_in_nemos_cache(
    tiny_nemo_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Where ASRModel.from_pretrained("tiny_ctc") would have saved it.
    cached = tmp_path / "tiny_ctc" / "0123abcd" / "tiny_ctc.nemo"
    cached.parent.mkdir(parents=True)
    shutil.copy(tiny_nemo_model, cached)
    monkeypatch.setenv("NEMO_CACHE_DIR", str(tmp_path))
    stt = await load_stt(parakeet_settings(Path("tiny_ctc")))
    try:
        assert isinstance(stt, ParakeetStt) and stt.model_path == cached
        assert await stt.transcribe(phrase_audio("goforward")) == "go forward ten meters"
    finally:
        stt.close()
    with pytest.raises(registry.BackendUnavailable) as error:
        registry.create("stt", "parakeet", parakeet_settings(Path("stt_en_no_such_model")))
    message = str(error.value)
    assert "'stt_en_no_such_model'" in message and f"NeMo's local cache ({tmp_path})" in message


def test_a_corrupt_model_file_is_a_clear_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken.nemo"
    broken.write_bytes(b"not a tar archive")
    with pytest.raises(registry.BackendUnavailable) as error:
        registry.create("stt", "parakeet", parakeet_settings(broken))
    assert f"cannot load parakeet model {broken}" in str(error.value)


async def test_serve_with_a_missing_parakeet_model_exits_with_how_to_fix_it(
    tmp_path: Path,
) -> None:
    text = await serve_refusing_to_start(
        "--stt", "parakeet", "--stt-model", str(tmp_path / "nowhere.nemo")
    )
    assert "cannot start" in text and "nowhere.nemo does not exist" in text


def test_partials_are_on_by_default_for_parakeet_only(
    engine: Engine, parakeet: SttBackend, tiny_nemo_model: Path
) -> None:
    assert engine.models is not None and engine.models.stt.name == "faster-whisper"
    remote = registry.create(
        "stt", "openai", settings_with(stt="openai", stt_base_url="http://127.0.0.1:9/v1")
    )
    defaults = {
        stt.name: engine_with_stt(engine, stt, settings_with()).session_config()
        for stt in (parakeet, engine.models.stt, remote)
    }
    assert {name: c.partial_interval_ms for name, c in defaults.items()} == {
        "parakeet": 500,
        "faster-whisper": 0,  # on with --stt-partial-lane idle
        "openai": 0,
    }
    # The setting wins over the backend's default.
    chosen = engine_with_stt(engine, parakeet, settings_with(stt_partial_interval_ms=250))
    assert chosen.session_config().partial_interval_ms == 250


async def test_the_same_checks_and_safe_decode_serve_parakeet(parakeet: SttBackend) -> None:
    """The fallback is the session's, not Whisper's: a clear phrase is
    trusted as is; a turn the VAD called speech that gives no words (here
    too short for the model's subsampling) is decoded again the safe way,
    the audio with silence on either side."""
    assert isinstance(parakeet, CarefulTranscriber)
    stats = HearingStats()
    hearing = Hearing(parakeet, stats, "test")
    heard = await hearing.final(phrase_audio("goforward"), 2000, None)
    assert heard.text == "go forward ten meters" and heard.distrusted is None
    careful = await parakeet.transcribe_detailed(phrase_audio("goforward"), careful=True)
    assert careful is not None and careful.careful
    assert careful.text == "go forward ten meters"
    assert not stats.redecoded
    clipped = phrase_audio("goforward")[:1000]
    fast = await parakeet.transcribe_detailed(clipped)
    assert fast is not None and fast.text == ""
    again = await hearing.final(clipped, 2000, None)
    assert again.distrusted == "empty" and stats.redecoded == {"empty": 1}
