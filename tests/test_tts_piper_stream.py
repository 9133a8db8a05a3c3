"""Piper's first piece streamed window by window: the same audio as Piper's
own synthesis, in several chunks, for several sessions at once."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper
from piper import PiperVoice
from piper.config import PiperConfig

from tests.logged import Logged
from voice_agent.backends.base import synthesize
from voice_agent.backends.tts import piper_split
from voice_agent.backends.tts.piper_split import FIRST_WINDOW_FRAMES, split_voice, windows
from voice_agent.backends.tts.piper_tts import (
    GAIN_RAMP,
    PiperTts,
    _follow_peak,
    _soft_limit,
    default_voice_path,
)

TEXTS = [
    "Well, that depends on the weather.",  # its loudest moment comes after the first window
    "That is a great question, and the answer is longer than you think.",
]


@pytest.fixture(scope="module")
def quiet_voice(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packaged voice with its noise turned off, so two syntheses of a
    text are the same audio and can be compared sample for sample."""
    folder = tmp_path_factory.mktemp("voice")
    source = default_voice_path()
    (folder / "joe.onnx").symlink_to(source)
    config = json.loads(Path(f"{source}.json").read_text(encoding="utf-8"))
    config["inference"] = {**config.get("inference", {}), "noise_scale": 0.0, "noise_w": 0.0}
    (folder / "joe.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    return folder / "joe.onnx"


def slow_twin(voice: Path, folder: Path) -> Path:
    """The same model, its config saying 16 kHz: a voice at another rate."""
    config = json.loads(Path(f"{voice}.json").read_text(encoding="utf-8"))
    config["audio"]["sample_rate"] = 16000
    (folder / "slow.onnx").symlink_to(voice.resolve())
    (folder / "slow.onnx.json").write_text(json.dumps(config), encoding="utf-8")
    return folder / "slow.onnx"


def piper_reference(voice_path: Path, text: str) -> np.ndarray:
    """Piper's own synthesis through the whole graph, as the backend did before."""
    config = PiperConfig.from_dict(json.loads(Path(f"{voice_path}.json").read_text("utf-8")))
    session = onnxruntime.InferenceSession(str(voice_path), providers=["CPUExecutionProvider"])
    voice = PiperVoice(session=session, config=config)
    return np.concatenate([c.audio_int16_array for c in voice.synthesize(text)])


async def chunks_of(tts: PiperTts, text: str, urgent: bool) -> list[np.ndarray]:
    return [chunk async for chunk in tts.stream(text, urgent=urgent)]


def correlation(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_windows_cover_every_frame_once_the_first_short_then_growing() -> None:
    for frames in (1, 23, 24, 35, 36, 60, 180, 1000):
        ranges = list(windows(frames))
        assert ranges[0][0] == 0 and ranges[-1][1] == frames
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
        if frames >= FIRST_WINDOW_FRAMES * 3 // 2:
            assert ranges[0][1] == FIRST_WINDOW_FRAMES
        else:
            assert ranges == [(0, frames)]
        sizes = [end - start for start, end in ranges]
        assert all(later <= 3 * earlier for earlier, later in itertools.pairwise(sizes))


@pytest.mark.models
async def test_an_urgent_piece_comes_in_windows_that_join_into_piper_s_own_audio(
    quiet_voice: Path,
) -> None:
    tts = PiperTts(quiet_voice, 1.0, threads=2)
    try:
        for text in TEXTS:
            reference = piper_reference(quiet_voice, text)
            streamed = await chunks_of(tts, text, urgent=True)
            whole = await chunks_of(tts, text, urgent=False)
            assert len(streamed) >= 2, text  # the first window comes on its own
            assert streamed[0].size == FIRST_WINDOW_FRAMES * 256
            joined = np.concatenate(streamed)
            assert joined.size == reference.size == np.concatenate(whole).size
            # A later piece is Piper's synthesis exactly (through the two halves).
            assert np.abs(np.concatenate(whole).astype(int) - reference).max() <= 1
            # The streamed one is the same waveform; its level follows the
            # peak so far (Piper's is the whole sentence's peak from the start).
            assert correlation(joined, reference) > 0.99
            # At its peak bent by the limiter's knee, not clipped.
            assert np.abs(joined.astype(int)).max() > 0.9 * 32767
            assert np.count_nonzero(np.abs(joined.astype(int)) >= 32767) <= 2
    finally:
        tts.close()


@pytest.mark.models
async def test_sessions_streaming_at_once_each_get_their_own_audio(quiet_voice: Path) -> None:
    """Several sessions' first pieces share the one worker; none takes
    another's latent frames or gain."""
    tts = PiperTts(quiet_voice, 1.0, threads=1)
    try:
        alone = [np.concatenate(await chunks_of(tts, text, urgent=True)) for text in TEXTS * 2]
        together = await asyncio.gather(*(chunks_of(tts, text, urgent=True) for text in TEXTS * 2))
        for solo, chunks in zip(alone, together, strict=True):
            assert len(chunks) >= 2
            assert np.array_equal(np.concatenate(chunks), solo)
    finally:
        tts.close()


@pytest.mark.models
async def test_a_piece_of_two_sentences_in_a_voice_at_another_rate(
    quiet_voice: Path, tmp_path: Path
) -> None:
    """Each sentence is encoded and windowed on its own, and a second voice
    whose rate differs from the backend's is resampled across its windows."""
    tts = PiperTts({"joe": quiet_voice, "slow": slow_twin(quiet_voice, tmp_path)}, 1.0, threads=1)
    text = "It is sunny today. Tomorrow it will rain for most of the afternoon."
    try:
        for voice in ("joe", "slow"):
            streamed = [c async for c in tts.stream(text, voice, urgent=True)]
            whole = await synthesize(tts, text, voice)
            joined = np.concatenate(streamed)
            assert len(streamed) >= 4, voice  # two sentences, each in windows
            assert abs(joined.size - whole.size) <= 2, voice
            assert correlation(joined[: whole.size], whole[: joined.size]) > 0.99, voice
        # 16 kHz audio brought to the backend's 22.05 kHz: 22050/16000 as many samples.
        joe = await synthesize(tts, text, "joe")
        slow = await synthesize(tts, text, "slow")
        assert slow.size == pytest.approx(joe.size * 22050 / 16000, rel=0.01)
    finally:
        tts.close()


def test_a_louder_window_brings_the_gain_down_smoothly() -> None:
    quiet = np.sin(np.arange(2048) / 5).astype(np.float32) * 0.2
    loud = np.sin(np.arange(2048) / 5).astype(np.float32) * 0.8
    gain, first = _follow_peak(quiet, None)
    assert gain == pytest.approx(5.0, rel=0.01) and np.abs(first).max() == pytest.approx(1.0)
    lowered, second = _follow_peak(loud, gain)
    assert lowered == pytest.approx(1.25, rel=0.01)
    assert np.abs(second[GAIN_RAMP:]).max() == pytest.approx(1.0, rel=0.01)
    assert np.abs(_soft_limit(second)).max() <= 1.0  # bent at the knee, never past full scale
    # Silence first sets no gain: the first sound does.
    assert _follow_peak(np.zeros(256, dtype=np.float32), None)[0] is None


@pytest.mark.models
def test_a_graph_that_is_not_a_piper_vits_voice_is_made_whole(tmp_path: Path) -> None:
    node = helper.make_node("Identity", ["input"], ["output"], name="identity")
    graph = helper.make_graph(
        [node],
        "not-vits",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1])],
    )
    path = tmp_path / "other.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert split_voice(path, onnxruntime.SessionOptions(), 256, 1) is None
    assert split_voice(default_voice_path(), onnxruntime.SessionOptions(), 256, 2) is None


@pytest.mark.models
async def test_the_packaged_voice_streams_its_first_piece() -> None:
    tts = PiperTts(default_voice_path(), 1.0, threads=1)
    try:
        # Its durations are noisy (noise_w), so lengths vary run to run.
        chunks = await chunks_of(tts, TEXTS[1], urgent=True)
        assert len(chunks) >= 2 and chunks[0].size == FIRST_WINDOW_FRAMES * 256
        assert len(await chunks_of(tts, TEXTS[1], urgent=False)) == 1
        assert (await synthesize(tts, TEXTS[1])).size > 2 * 22050  # seconds of speech
    finally:
        tts.close()


@pytest.mark.models
async def test_a_piece_cut_off_while_it_streams_leaves_no_task_behind() -> None:
    """A barge-in cancels the consumer while it waits for the next window:
    the stream's own wait on its queue goes with it, not left pending."""
    tts = PiperTts(default_voice_path(), 1.0, threads=1)
    try:
        stream = tts.stream(TEXTS[1], urgent=True)
        first = asyncio.Event()

        async def listen() -> None:
            async for _ in stream:
                first.set()

        listener = asyncio.create_task(listen())
        await asyncio.wait_for(first.wait(), 30)
        await asyncio.sleep(0)  # back waiting for the next window
        listener.cancel()
        with pytest.raises(asyncio.CancelledError):
            await listener
        await asyncio.sleep(0)
        waiting = [t for t in asyncio.all_tasks() if "Queue.get" in repr(t) and not t.done()]
        assert waiting == []
    finally:
        tts.close()


def _cached_halves(cache: Path) -> Path:
    return cache / piper_split.CACHE_FOLDER / default_voice_path().stem


@pytest.mark.models
def test_the_halves_are_cut_once_then_read_from_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = onnxruntime.SessionOptions()
    cut = split_voice(default_voice_path(), options, 256, 1, cache=tmp_path)
    assert cut is not None
    voice = onnx.load(str(default_voice_path()))
    (node,) = (n for n in voice.graph.node if n.name == piper_split.DECODER_INPUT_NODE)
    assert cut.latent == node.input[0]
    cached = sorted(p.name.split("-")[0] for p in _cached_halves(tmp_path).iterdir())
    assert cached == ["decoder", "encoder"]

    def no_cutting(path: Path) -> list[bytes] | None:
        raise AssertionError("the halves were cut again")

    monkeypatch.setattr(piper_split, "_cut", no_cutting)
    read = split_voice(default_voice_path(), options, 256, 1, cache=tmp_path)
    assert read is not None and read.latent == node.input[0]
    latent = cut.encode([1, 20, 30, 40, 2], np.array([0.667, 1.0, 0.0], dtype=np.float32))
    np.testing.assert_array_equal(read.decode(latent, 0, 8), cut.decode(latent, 0, 8))


@pytest.mark.models
def test_a_half_missing_from_the_cache_is_cut_again(tmp_path: Path) -> None:
    options = onnxruntime.SessionOptions()
    assert split_voice(default_voice_path(), options, 256, 1, cache=tmp_path) is not None
    (decoder,) = _cached_halves(tmp_path).glob("decoder-*.onnx")
    decoder.unlink()
    assert split_voice(default_voice_path(), options, 256, 1, cache=tmp_path) is not None
    assert decoder.is_file()


@pytest.mark.models
async def test_halves_that_cannot_be_loaded_leave_the_whole_voice_then_are_cut_again(
    tmp_path: Path,
) -> None:
    options = onnxruntime.SessionOptions()
    assert split_voice(default_voice_path(), options, 256, 1, cache=tmp_path) is not None
    for half in _cached_halves(tmp_path).iterdir():
        half.write_bytes(b"not a graph")
    with Logged(piper_split.__name__) as logged:
        assert split_voice(default_voice_path(), options, 256, 1, cache=tmp_path) is None
    assert any("cannot load the Piper voice's halves" in r.getMessage() for r in logged.records)
    assert not list(_cached_halves(tmp_path).iterdir())  # removed: the next start cuts again
    assert split_voice(default_voice_path(), options, 256, 1, cache=tmp_path) is not None


@pytest.mark.models
def test_a_start_with_the_halves_cached_leaves_onnx_unimported(tmp_path: Path) -> None:
    # Cutting the graph needs the onnx package; reading the cut does not.
    code = (
        "import sys\n"
        "from voice_agent.backends.tts.piper_tts import PiperTts, default_voice_path\n"
        "tts = PiperTts(default_voice_path(), 1.0, threads=1)\n"
        "print(all(v.halves is not None for v in tts._voices.values()), 'onnx' in sys.modules)\n"
    )
    env = {**os.environ, "VOICE_AGENT_CACHE": str(tmp_path)}
    runs = [
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            timeout=120,
            env=env,
        )
        for _ in range(2)  # the first cuts and caches the halves
    ]
    assert runs[0].stdout.strip().splitlines()[-1] == "True True", runs[0].stdout + runs[0].stderr
    assert runs[1].stdout.strip().splitlines()[-1] == "True False", runs[1].stdout + runs[1].stderr
