"""Voices: a session chooses among the voices of the server's TTS
(``session.update`` ``audio.output.voice``, or one reply's
``response.create``), listed at ``GET /v1/voices``. Piper holds several
voices in one backend; the second and third voices here are the packaged
one under other names, with a slower pace (``length_scale``) or another
rate in their configs, so what a caller hears tells which voice spoke."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from tests.conftest import run_server
from tests.conftest import test_settings as settings_with
from tests.stt_fixtures import engine_with_models
from tests.test_faults import API, ask, caller
from voice_agent.backends.base import synthesize
from voice_agent.backends.registry import BackendUnavailable
from voice_agent.backends.tts.piper_tts import PiperTts, default_voice_path, voice_paths
from voice_agent.client import RealtimeClient
from voice_agent.engine import Engine
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    close_quietly,
    make_llm,
    scripted_llm_server,
    text_events,
)
from voice_agent.testing.serving import start_server, wait_ready

SLOW_PACE = 1.6  # the slow voice's length_scale (the packaged voice's is 1)
LOW_RATE = 16_000  # the low voice's config rate (the model makes 22.05 kHz)
LONG_REPLY = (
    "Paris is the capital of France, and it is known for its museums, "
    "its cafes and the river that runs through it."
)


def copied_voice(folder: Path, name: str, **changes: Any) -> Path:
    """The packaged voice as ``folder/name.onnx``, its config changed."""
    folder.mkdir(parents=True, exist_ok=True)
    model = default_voice_path()
    config = json.loads(Path(f"{model}.json").read_text())
    if "length_scale" in changes:
        config["inference"]["length_scale"] = changes["length_scale"]
    if "sample_rate" in changes:
        config["audio"]["sample_rate"] = changes["sample_rate"]
    target = folder / f"{name}.onnx"
    target.symlink_to(model)
    Path(f"{target}.json").write_text(json.dumps(config))
    return target


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("voices")
    copied_voice(folder, "slow", length_scale=SLOW_PACE)
    return folder


@pytest.fixture(scope="module")
def two_voices(voices_dir: Path) -> Iterator[PiperTts]:
    """``--tts-voice joe,FOLDER``: the packaged voice, then the slow one."""
    tts = PiperTts(voice_paths(f"joe,{voices_dir}"), 1.0, threads=1)
    yield tts
    tts.close()


def test_tts_voice_names_files_folders_and_the_packaged_voice(tmp_path: Path) -> None:
    folder = tmp_path / "many"
    slow = copied_voice(folder, "slow", length_scale=SLOW_PACE)
    copied_voice(folder, "low", sample_rate=LOW_RATE)
    assert voice_paths(None) == {"joe": default_voice_path()}
    assert list(voice_paths(f"joe, {folder}")) == ["joe", "low", "slow"]
    assert list(voice_paths(f"{slow},joe")) == ["slow", "joe"]  # the first is the default
    assert voice_paths(f"{slow},{folder}")["slow"] == slow  # the same file twice is one voice
    other = copied_voice(tmp_path / "other", "slow")
    with pytest.raises(BackendUnavailable, match="two Piper voices are named 'slow'"):
        voice_paths(f"{folder},{other}")
    with pytest.raises(BackendUnavailable, match=r"Piper voice not found: /nowhere/x\.onnx"):
        voice_paths("joe,/nowhere/x.onnx")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BackendUnavailable, match=r"no Piper voice .* in .*empty"):
        voice_paths(str(tmp_path / "empty"))
    Path(f"{other}.json").unlink()
    with pytest.raises(BackendUnavailable, match=r"has no slow\.onnx\.json beside it"):
        PiperTts(voice_paths(str(other)), 1.0, threads=1)


@pytest.mark.models
async def test_one_piper_backend_speaks_each_voice_on_one_inference_thread(
    tmp_path: Path,
) -> None:
    copied_voice(tmp_path, "slow", length_scale=SLOW_PACE)
    copied_voice(tmp_path, "low", sample_rate=LOW_RATE)
    before = set(threading.enumerate())
    tts = PiperTts(voice_paths(f"joe,{tmp_path}"), 1.0, threads=1)
    try:
        assert tts.voices() == ("joe", "low", "slow") and tts.sample_rate == 22050
        text = "The quick brown fox jumps over the lazy dog near the river bank."
        joe, slow, low = [await synthesize(tts, text, v) for v in ("joe", "slow", "low")]
        assert (await synthesize(tts, text)).size > 0  # None: the default
        # Piper's durations vary a few per cent from one run to the next.
        assert 1.35 < slow.size / joe.size < 1.85, (slow.size, joe.size)
        # 22.05 kHz samples read as 16 kHz, brought to the backend's 22.05 kHz.
        assert 1.2 < low.size / joe.size < 1.55, (low.size, joe.size)
        # Every voice ran on the backend's one inference thread.
        started = [t for t in set(threading.enumerate()) - before if t.name.startswith("tts")]
        assert len(started) == 1, started
        with pytest.raises(ValueError, match=r"no Piper voice 'amy' .*joe, low, slow"):
            await synthesize(tts, text, "amy")
    finally:
        tts.close()


@pytest_asyncio.fixture
async def voices_call(
    engine: Engine, two_voices: PiperTts, peer: ScriptedLlmServer
) -> AsyncIterator[Any]:
    llm = make_llm(API, peer.base_url)
    settings = settings_with(llm_prefill=False)
    served = engine_with_models(engine, settings, llm=llm, tts=two_voices)
    try:
        async with run_server(settings, served) as server:
            yield server
    finally:
        await close_quietly(llm)


def played_s(client: RealtimeClient, response_id: str) -> float:
    """How much of the reply's audio was heard, in seconds: the audible
    frames received between output_audio_buffer started and stopped (not
    the wall time between them, which stalls on a loaded machine stretch)."""
    times = {
        event["type"]: at
        for event, at in zip(client.events, client.event_times, strict=True)
        if event.get("response_id") == response_id
        and event["type"] in ("output_audio_buffer.started", "output_audio_buffer.stopped")
    }
    start, end = times["output_audio_buffer.started"], times["output_audio_buffer.stopped"]
    received = client.received
    return sum(
        len(chunk) / 48_000
        for chunk, at in zip(received.chunks, received.arrivals, strict=True)
        if start <= at <= end + 0.2 and chunk.size and int(np.abs(chunk).max()) > 100
    )


def update_voice(client: RealtimeClient, voice: Any) -> asyncio.Future[dict[str, Any]]:
    """session.update with the voice; the next session.updated or error."""
    after = len(client.events)
    answer = client.wait_for(lambda e: e["type"] in ("session.updated", "error"), after=after)
    client.send(
        {
            "type": "session.update",
            "session": {"type": "realtime", "audio": {"output": {"voice": voice}}},
        }
    )
    return answer


@pytest.mark.e2e
@pytest.mark.slow
async def test_a_caller_chooses_among_the_servers_voices(
    voices_call: Any, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    server = voices_call
    async with http.get(server.url + "/v1/voices") as answer:
        assert answer.status == 200
        listed = await answer.json()
    assert listed == {
        "object": "list",
        "data": [
            {"name": "joe", "backend": "piper", "default": True, "sample_rate": 22050},
            {"name": "slow", "backend": "piper", "default": False, "sample_rate": 22050},
        ],
    }
    peer.add(*(Script(text_events(API, LONG_REPLY)) for _ in range(3)))
    client = await caller(server, http)
    (created,) = client.of_type("session.created")
    assert created["session"]["audio"]["output"]["voice"] == "joe"

    # A voice the server lacks is refused, naming the ones it has; nothing changes.
    refused = await asyncio.wait_for(update_voice(client, "alloy"), 5)
    assert refused["type"] == "error", refused
    assert refused["error"]["param"] == "session.audio.output.voice"
    assert "'alloy'" in refused["error"]["message"]
    assert "'joe', 'slow'" in refused["error"]["message"]
    (call,) = server.calls.calls()
    assert call.session.voice is None

    first = await asyncio.wait_for(ask(client, "Tell me about Paris."), 60)
    assert first["status"] == "completed" and first["audio"]["output"]["voice"] == "joe"

    updated = await asyncio.wait_for(update_voice(client, {"id": "slow"}), 5)
    assert updated["type"] == "session.updated", updated
    assert updated["session"]["audio"]["output"]["voice"] == "slow"
    slow = await asyncio.wait_for(ask(client, "Tell me about Paris."), 60)
    assert slow["status"] == "completed" and slow["audio"]["output"]["voice"] == "slow"

    # One reply in another voice; the session keeps its own.
    joe_again = await asyncio.wait_for(
        ask(client, "Tell me about Paris.", audio={"output": {"voice": "joe"}}), 60
    )
    assert joe_again["status"] == "completed"
    assert joe_again["audio"]["output"]["voice"] == "joe"
    assert call.session.voice == "slow"

    # What was heard says which voice spoke: the slow one takes ~1.6 times as long.
    joe_s, slow_s, again_s = (played_s(client, r["id"]) for r in (first, slow, joe_again))
    assert slow_s > 1.3 * joe_s and slow_s > 1.3 * again_s, (joe_s, slow_s, again_s)
    # response.create naming a voice the server lacks is refused too.
    error = client.wait_for_type("error", after=len(client.events))
    client.send({"type": "response.create", "response": {"audio": {"output": {"voice": "x"}}}})
    assert (await asyncio.wait_for(error, 5))["error"]["param"] == ("response.audio.output.voice")
    await client.hangup(http)


@pytest.mark.e2e
@pytest.mark.slow
async def test_with_workers_the_model_process_speaks_each_voice(
    voices_dir: Path, http: aiohttp.ClientSession
) -> None:
    """``--workers 2``: the voices are the model process's, listed through
    the front; a worker's session picks one and the model process speaks it."""
    async with scripted_llm_server() as peer:
        peer.add(*(Script(text_events(API, LONG_REPLY)) for _ in range(2)))
        process, url = await start_server(
            *("--workers", "2", "--tts-voice", f"joe,{voices_dir}"),
            *("--llm-base-url", peer.base_url, "--llm-model", "scripted-model"),
            "--no-llm-prefill",
        )
        try:
            await wait_ready(http, url, timeout_s=240)
            async with http.get(url + "/v1/voices") as answer:
                listed = await answer.json()
            assert [(v["name"], v["default"]) for v in listed["data"]] == [
                ("joe", True),
                ("slow", False),
            ]
            client = RealtimeClient(url)
            await client.connect(http)
            await asyncio.wait_for(client.wait_for_type("session.created"), 10)
            refused = await asyncio.wait_for(update_voice(client, "alloy"), 5)
            assert refused["type"] == "error" and "'joe', 'slow'" in refused["error"]["message"]
            first = await asyncio.wait_for(ask(client, "Tell me about Paris."), 90)
            updated = await asyncio.wait_for(update_voice(client, "slow"), 5)
            assert updated["session"]["audio"]["output"]["voice"] == "slow"
            slow = await asyncio.wait_for(ask(client, "Tell me about Paris."), 90)
            for response in (first, slow):
                assert response["status"] == "completed", response.get("status_details")
            assert played_s(client, slow["id"]) > 1.3 * played_s(client, first["id"])
            await client.hangup(http)
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                async with asyncio.timeout(30):
                    await process.wait()
