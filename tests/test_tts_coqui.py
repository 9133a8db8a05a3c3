"""Coqui TTS (``--tts coqui``) with tiny models built here by Coqui's own
classes (voice_agent/testing/tiny_coqui.py): XTTS streams chunk by chunk to a real WebRTC
peer, a barge-in closes its generator, sessions share the one model, a
multi-speaker VITS speaks with its speakers, and a missing or corrupt model
stops start-up with a clear message."""

from __future__ import annotations

import asyncio
import itertools
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from tests.conftest import RunningServer, run_server, serve_refusing_to_start
from tests.conftest import test_settings as settings_with
from tests.stt_fixtures import engine_with_models
from voice_agent.backends import registry
from voice_agent.backends.base import synthesize
from voice_agent.backends.runtime.packaged import is_installed
from voice_agent.client import RealtimeClient
from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.testing.audio_data import librivox
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    chat_text,
    close_quietly,
    make_llm,
)

if not is_installed("TTS"):
    pytest.skip(
        "the coqui extra (coqui-tts) is not installed: make install-coqui",
        allow_module_level=True,
    )

from voice_agent.backends.tts.coqui import XTTS_CHUNK_TOKENS, CoquiTts, _XttsStream
from voice_agent.testing.tiny_coqui import (
    VITS_SPEAKERS,
    XTTS_SPEAKER,
    XTTS_TOKENS,
    build_tiny_vits,
    build_tiny_xtts,
    speaker_wav,
)

pytestmark = [pytest.mark.e2e, pytest.mark.models]

# A full piece: XTTS_TOKENS in chunks of XTTS_CHUNK_TOKENS, and the tail
# XTTS keeps back to cross-fade with a next chunk.
CHUNKS_PER_PIECE = XTTS_TOKENS // XTTS_CHUNK_TOKENS + 1
STORY = [f"Sentence number {n} of a long story about the sea." for n in range(1, 9)]


class ObservedCoqui(CoquiTts):
    """Records, in the worker thread, each chunk made and each generator
    closed early, with the piece's text and the time."""

    made: list[tuple[str, float]]
    closed: list[tuple[str, float]]
    closed_one: asyncio.Event
    loop: asyncio.AbstractEventLoop

    def _next_chunk(self, stream: _XttsStream) -> np.ndarray | None:
        chunk = super()._next_chunk(stream)
        if chunk is not None:
            self.made.append((stream.text, time.monotonic()))
        return chunk

    def _close_stream(self, stream: _XttsStream) -> None:
        super()._close_stream(stream)
        self.closed.append((stream.text, time.monotonic()))
        self.loop.call_soon_threadsafe(self.closed_one.set)


def coqui_settings(model: Path, **overrides: Any) -> Settings:
    return settings_with(tts="coqui", tts_model=str(model), tts_device="cpu", **overrides)


async def load_observed(settings: Settings) -> ObservedCoqui:
    """Loaded as ``--tts coqui`` loads it (the registry's factory's arguments)."""
    tts = await asyncio.to_thread(ObservedCoqui.from_settings, settings)
    tts.made, tts.closed = [], []
    tts.closed_one, tts.loop = asyncio.Event(), asyncio.get_running_loop()
    return tts


@pytest.fixture(scope="session")
def tiny_vits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_vits(tmp_path_factory.mktemp("coqui") / "vits")


FFMPEG_5 = (
    "libavcodec59 libavformat59 libavutil57 libavdevice59 libavfilter8 libswscale6 libswresample4"
)


@pytest.fixture(scope="session")
def tiny_xtts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    try:  # XTTS reads speaker wavs through torchaudio, which reads them through torchcodec
        import torchcodec.decoders  # noqa: F401
    except Exception as exc:
        pytest.skip(f"torchcodec cannot load FFmpeg 5 (apt-get install {FFMPEG_5}): {exc}")
    return build_tiny_xtts(tmp_path_factory.mktemp("coqui") / "xtts")


@pytest.fixture(scope="session")
def voice_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("voices")
    speaker_wav(folder / "alice.wav", 220.0)
    return folder


@pytest_asyncio.fixture(scope="session")
async def xtts(tiny_xtts: Path, voice_folder: Path) -> AsyncIterator[ObservedCoqui]:
    """The process-wide XTTS backend, as `--tts coqui` would load it."""
    tts = await load_observed(coqui_settings(tiny_xtts, tts_voice=str(voice_folder)))
    yield tts
    tts.close()


@asynccontextmanager
async def serve_with(
    engine: Engine, tts: Any, peer: ScriptedLlmServer, **overrides: Any
) -> AsyncIterator[RunningServer]:
    llm = make_llm("chat-completions", peer.base_url, read_timeout_s=30.0)
    settings = coqui_settings(Path(str(tts.model_path)), llm_prefill=False, **overrides)
    try:
        async with run_server(
            settings, engine_with_models(engine, settings, tts=tts, llm=llm)
        ) as s:
            yield s
    finally:
        await close_quietly(llm)


async def connected(server: RunningServer, http: aiohttp.ClientSession) -> RealtimeClient:
    client = RealtimeClient(server.url)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    return client


async def test_xtts_voices_are_the_cloned_wavs_then_the_models_speakers(
    xtts: ObservedCoqui,
) -> None:
    assert xtts.streams and xtts.sample_rate == 24000 and xtts.device == "cpu"
    assert xtts.voices() == ("alice", XTTS_SPEAKER)  # alice (--tts-voice) is the default
    with pytest.raises(ValueError, match="alice, Studio Voice"):
        await synthesize(xtts, "Hello.", "nobody")


async def test_xtts_chunks_stream_to_a_webrtc_peer_as_they_are_made(
    engine: Engine,
    xtts: ObservedCoqui,
    peer: ScriptedLlmServer,
    http: aiohttp.ClientSession,
) -> None:
    text = "Hello there, this is a streamed reply."
    peer.add(Script(chat_text(text)))
    async with serve_with(engine, xtts, peer) as server:
        client = await connected(server, http)
        xtts.made.clear()
        asked = time.monotonic()
        client.send({"type": "response.create"})
        done = await asyncio.wait_for(client.wait_for_type("response.done"), 90)
        assert done["response"]["status"] == "completed", done
        await asyncio.sleep(0.5)  # the jitter buffer drains
        pieces = list(dict.fromkeys(piece for piece, _ in xtts.made))
        assert " ".join(p.strip() for p in pieces) == text
        for piece in pieces:
            assert sum(1 for p, _ in xtts.made if p == piece) == CHUNKS_PER_PIECE
        first_piece = [t for piece, t in xtts.made if piece == pieces[0]]
        first_sound = client.received.first_sound_after(asked, threshold=100)
        assert first_sound is not None, "no audio came back"
        # Streamed: the peer heard the piece before its last chunk was made.
        assert first_sound < first_piece[-1], (first_sound - asked, first_piece[-1] - asked)
        transcript = "".join(
            e["delta"] for e in client.of_type("response.output_audio_transcript.delta")
        )
        assert transcript == text
        await client.hangup(http)
        await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_barge_in_closes_the_generator_before_its_next_chunk(
    engine: Engine,
    xtts: ObservedCoqui,
    peer: ScriptedLlmServer,
    http: aiohttp.ClientSession,
) -> None:
    peer.add(Script(chat_text(*(s + " " for s in STORY))), Script(chat_text("Yes?")))
    async with serve_with(engine, xtts, peer) as server:
        client = await connected(server, http)
        xtts.made.clear()
        xtts.closed.clear()
        xtts.closed_one.clear()
        client.send({"type": "response.create"})
        await asyncio.wait_for(client.wait_for_type("output_audio_buffer.started"), 60)
        mark = len(client.events)
        done = client.wait_for_type("response.done", after=mark)
        await client.mic.play(librivox("0930"), 16000)  # the user talks over it
        cancelled = (await asyncio.wait_for(done, 30))["response"]
        assert cancelled["status"] == "cancelled"
        assert cancelled["status_details"]["reason"] == "turn_detected"
        cut = client.event_times[client.events.index(done.result())]

        # The open generator is closed (in the worker thread, after the chunk
        # it was making), and nothing more of the story is made.
        await asyncio.wait_for(xtts.closed_one.wait(), 20)
        await asyncio.sleep(1.0)
        story_made = [(p, t) for p, t in xtts.made if p in STORY]
        closed = {p: t for p, t in xtts.closed if p in STORY}
        for piece, closed_at in closed.items():
            assert all(t <= closed_at for p, t in story_made if p == piece)
        after_cut = [p for p, t in story_made if t > cut]
        assert len(after_cut) <= len(closed), after_cut  # at most the one in flight each
        assert len(story_made) < len(STORY) * CHUNKS_PER_PIECE
        await client.hangup(http)
        await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_simultaneous_sessions_share_the_model_and_interleave_by_chunk(
    engine: Engine,
    xtts: ObservedCoqui,
    peer: ScriptedLlmServer,
    http: aiohttp.ClientSession,
) -> None:
    texts = ["The first caller hears this.", "A second caller hears this one.", "Third."]
    # The tiny XTTS is greedy: a piece's audio is the same alone or
    # interleaved with others' (each piece's GPT prompt is restored per chunk).
    alone = [await synthesize(xtts, text) for text in texts]
    together = await asyncio.gather(*(synthesize(xtts, text) for text in texts))
    for one, other in zip(alone, together, strict=True):
        np.testing.assert_array_equal(one, other)

    peer.add(*(Script(chat_text(text)) for text in texts))
    async with serve_with(engine, xtts, peer, max_calls=4) as server:
        clients = [await connected(server, http) for _ in texts]
        xtts.made.clear()
        asked = time.monotonic()
        dones = [c.wait_for_type("response.done") for c in clients]
        for client in clients:
            client.send({"type": "response.create"})
        finished = await asyncio.wait_for(asyncio.gather(*dones), 120)
        assert [d["response"]["status"] for d in finished] == ["completed"] * 3
        await asyncio.sleep(0.5)
        for client in clients:
            assert client.received.first_sound_after(asked, threshold=100) is not None
        order = [piece for piece, _ in xtts.made]
        assert sorted(set(order)) == sorted(texts)
        # One model, one chunk at a time, the sessions' chunks interleaved.
        runs = sum(1 for a, b in itertools.pairwise(order) if a != b) + 1
        assert runs > len(texts), order
        for client in clients:
            await client.hangup(http)
        await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_a_multi_speaker_vits_speaks_each_piece_with_its_speakers(
    engine: Engine,
    tiny_vits: Path,
    peer: ScriptedLlmServer,
    http: aiohttp.ClientSession,
) -> None:
    settings = coqui_settings(tiny_vits, tts_voice="bob")
    tts = await asyncio.to_thread(registry.create, "tts", "coqui", settings)
    try:
        assert isinstance(tts, CoquiTts) and not tts.streams and tts.sample_rate == 16000
        # --tts-voice bob (the model's second speaker) is the default, then the rest.
        assert tts.voices() == ("bob", "ann") and VITS_SPEAKERS == ("ann", "bob")
        bob = await synthesize(tts, "Hello there.", "bob")
        ann = await synthesize(tts, "Hello there.", "ann")
        assert bob.size > 1000 and bob.dtype == np.int16
        assert not np.array_equal(bob, ann)  # the speaker embedding is used
        peer.add(Script(chat_text("Hello from a tiny voice.")))
        async with serve_with(engine, tts, peer) as server:
            client = await connected(server, http)
            asked = time.monotonic()
            client.send({"type": "response.create"})
            done = await asyncio.wait_for(client.wait_for_type("response.done"), 60)
            assert done["response"]["status"] == "completed"
            await asyncio.sleep(0.5)
            assert client.received.first_sound_after(asked, threshold=100) is not None
            await client.hangup(http)
            await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    finally:
        tts.close()


def broken_copy(model: Path, tmp_path: Path, name: str, content: bytes) -> Path:
    copy = tmp_path / f"broken-{name}"
    shutil.copytree(model, copy)
    (copy / name).write_bytes(content)
    return copy


@pytest.mark.parametrize(
    ("broken", "message"),
    [
        ("missing", "Coqui model not found: {path}"),
        ("model.pth", "cannot load Coqui model {path}/model.pth"),
        ("config.json", "Coqui model config {path}/config.json is not a valid Coqui config"),
        ("empty", "holds no model.pth"),
    ],
)
def test_a_missing_or_corrupt_model_fails_at_load_with_a_clear_message(
    tiny_vits: Path, tmp_path: Path, broken: str, message: str
) -> None:
    if broken == "missing":
        path = tmp_path / "no-such-model"
    elif broken == "empty":
        path = tmp_path / "empty"
        path.mkdir()
    else:
        path = broken_copy(tiny_vits, tmp_path, broken, b"\x00not a model\xff" * 8)
    with pytest.raises(registry.BackendUnavailable) as failure:
        registry.create("tts", "coqui", coqui_settings(path))
    assert message.format(path=path) in str(failure.value)


@pytest.mark.parametrize("broken", ["missing", "model.pth"])
async def test_serve_refuses_to_start_on_a_missing_or_corrupt_model(
    tiny_vits: Path, tmp_path: Path, broken: str
) -> None:
    if broken == "missing":
        path, expected = tmp_path / "nowhere", f"Coqui model not found: {tmp_path / 'nowhere'}"
    else:
        path = broken_copy(tiny_vits, tmp_path, broken, b"garbage" * 100)
        expected = f"cannot load Coqui model {path / 'model.pth'}"
    stderr = await serve_refusing_to_start("--tts", "coqui", "--tts-model", str(path))
    assert expected in stderr
