"""``--stt-encoder onnx``: Whisper's encoder on ONNX Runtime, so that no
CTranslate2 model is held; it must give the states CTranslate2 gives, and a
turn longer than the 30 s window must still be heard whole."""

from __future__ import annotations

import gc
import os
import shutil
from pathlib import Path

import ctranslate2
import numpy as np
import pytest
from faster_whisper import WhisperModel

from voice_agent.backends.runtime.derived_cache import prune
from voice_agent.backends.stt import whisper_graph_cache as cache
from voice_agent.backends.stt import whisper_onnx_graphs as graphs
from voice_agent.backends.stt import whisper_weights
from voice_agent.backends.stt.whisper import FasterWhisperStt
from voice_agent.backends.stt.whisper_long import LONG_PIECE_MIN_S, LONG_PIECE_S, long_pieces
from voice_agent.backends.stt.whisper_onnx_encoder import OnnxWhisperEncoder
from voice_agent.backends.stt.whisper_weights import WeightsUnavailable
from voice_agent.testing.audio_data import librivox, reference, silence, word_error_rate

RATE = 16_000


@pytest.mark.models
def test_the_encoder_gives_the_states_ctranslate2_computes_in_float() -> None:
    path = whisper_weights.resolve("base")
    exact = WhisperModel(str(path), device="cpu", compute_type="float32", cpu_threads=2)
    encoder = OnnxWhisperEncoder(path, 2)
    for clip in ("0880", "0930", "0870"):
        mel = exact.feature_extractor(librivox(clip).astype(np.float32) / 32768)
        features = np.ascontiguousarray(mel[None, :, : mel.shape[1] - mel.shape[1] % 2])
        expected = np.asarray(
            exact.model.encode(ctranslate2.StorageView.from_array(features), to_cpu=True)
        )
        states = encoder.encode(features)
        assert states.shape == expected.shape == (1, features.shape[2] // 2, 512)
        # int8 arithmetic: CTranslate2's own int8 is 0.04-0.07 off here; an
        # int8 product after the GELU made it 0.11-0.20.
        off = np.linalg.norm(states - expected) / np.linalg.norm(expected)
        assert off < 0.08, (clip, off)


def _whisper_models() -> int:
    gc.collect()
    return sum(isinstance(o, WhisperModel) for o in gc.get_objects())


@pytest.mark.models
def test_no_ctranslate2_model_is_held_unless_a_half_runs_on_it() -> None:
    before = _whisper_models()
    onnx = FasterWhisperStt("base", "en", 2)
    assert _whisper_models() == before
    mixed = FasterWhisperStt("base", "en", 2, decoder="ctranslate2")
    assert _whisper_models() == before + 1
    onnx.close()
    mixed.close()


def test_a_long_turn_is_cut_at_its_quietest_moment_into_whole_pieces() -> None:
    rng = np.random.default_rng(3)
    audio = rng.normal(0, 2000, 40 * RATE).astype(np.int16)
    audio[23 * RATE : int(23.3 * RATE)] = 0  # a pause 23 s in
    pieces = long_pieces(audio)
    assert len(pieces[0]) in range(23 * RATE, int(23.3 * RATE))
    assert np.array_equal(np.concatenate(pieces), audio)  # nothing lost or repeated
    # No pause at all: cut anyway, within the bounds.
    pieces = long_pieces(rng.normal(0, 2000, 70 * RATE).astype(np.int16))
    assert sum(len(p) for p in pieces) == 70 * RATE
    assert all(len(p) <= LONG_PIECE_S * RATE for p in pieces)
    assert all(len(p) >= LONG_PIECE_MIN_S * RATE for p in pieces[:-1])


@pytest.mark.models
@pytest.mark.slow
async def test_a_turn_longer_than_the_window_is_heard_whole() -> None:
    clips = ["0870", "0880", "0890", "0920", "0930", "0870"]
    gap = silence(0.7)
    audio = np.concatenate([part for c in clips for part in (librivox(c), gap)])
    assert len(audio) > 30 * RATE
    stt = FasterWhisperStt("base", "en", 2)
    try:
        result = await stt.transcribe_detailed(audio)
    finally:
        stt.close()
    assert result is not None and result.careful
    expected = " ".join(reference(c) for c in clips)
    assert word_error_rate(expected, result.text) <= 0.15, result.text


@pytest.mark.models
def test_the_encoder_graph_is_built_once_and_again_for_another_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_file = whisper_weights.resolve("base") / "model.bin"
    built = cache.encoder_graph(model_file, cache=tmp_path)
    made = [p.name.split("-")[0] for p in (tmp_path / cache.CACHE_FOLDER).glob("*")]
    assert made == ["encoder"]

    def never(*args: object) -> None:
        raise AssertionError("built again")

    monkeypatch.setattr(cache, "read_variables", never)  # from disk: no weights read
    assert cache.encoder_graph(model_file, cache=tmp_path) == built
    monkeypatch.undo()
    monkeypatch.setattr(graphs, "build_encoder_graph", never)
    other = tmp_path / "other-model.bin"  # another model's file: not the same graph
    other.write_bytes(model_file.read_bytes() + b"\0")
    with pytest.raises(AssertionError, match="built again"):
        cache.encoder_graph(other, cache=tmp_path)


def test_the_cache_keeps_the_newest_keys_graphs_only(tmp_path: Path) -> None:
    folder = tmp_path / cache.CACHE_FOLDER
    folder.mkdir()
    keys = [f"{k:016x}" for k in range(5)]
    for age, key in enumerate(reversed(keys)):  # keys[4] newest
        for stem in ("step", "cross", "encoder"):
            path = folder / f"{stem}-{key}.onnx"
            path.write_bytes(b"graph")
            os.utime(path, (1_000_000 - age * 100, 1_000_000 - age * 100))
    prune(folder, cache.KEPT_KEYS)
    left = {p.stem.split("-")[1] for p in folder.iterdir()}
    assert left == set(keys[-cache.KEPT_KEYS :])
    assert len(list(folder.iterdir())) == 3 * cache.KEPT_KEYS  # each key's set whole


@pytest.mark.models
def test_the_superseded_decoder_only_cache_goes_when_the_cache_is_used(tmp_path: Path) -> None:
    old = tmp_path / cache.SUPERSEDED_FOLDERS[0]
    old.mkdir()
    (old / "step-d584b1452b0a8819.onnx").write_bytes(b"graph")
    (old / "cross-d584b1452b0a8819.onnx").write_bytes(b"graph")
    cache.encoder_graph(whisper_weights.resolve("base") / "model.bin", cache=tmp_path)
    assert not old.exists()


def test_only_the_superseded_graphs_are_removed(tmp_path: Path) -> None:
    old = tmp_path / cache.SUPERSEDED_FOLDERS[0]
    old.mkdir()
    for name in ("step-0a.onnx", "cross-0a.onnx", "mine.onnx", "notes.txt"):
        (old / name).write_bytes(b"x")
    similar = tmp_path / f"{cache.SUPERSEDED_FOLDERS[0]}-mine"  # another folder: untouched
    similar.mkdir()
    (similar / "step-0a.onnx").write_bytes(b"graph")
    cache._remove_superseded(tmp_path)
    assert sorted(p.name for p in old.iterdir()) == ["mine.onnx", "notes.txt"]
    assert (similar / "step-0a.onnx").exists()


def test_a_superseded_folder_that_is_a_link_is_left_alone(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "step-0a.onnx").write_bytes(b"graph")
    root = tmp_path / "cache"
    root.mkdir()
    (root / cache.SUPERSEDED_FOLDERS[0]).symlink_to(elsewhere, target_is_directory=True)
    cache._remove_superseded(root)
    assert (elsewhere / "step-0a.onnx").exists()


@pytest.mark.models
def test_a_model_folder_without_its_tokenizer_is_refused_with_the_fix(tmp_path: Path) -> None:
    packaged = whisper_weights.resolve("base")
    (tmp_path / "model.bin").symlink_to(packaged / "model.bin")
    shutil.copyfile(packaged / "config.json", tmp_path / "config.json")
    with pytest.raises(WeightsUnavailable, match=r"no tokenizer\.json: convert"):
        FasterWhisperStt(str(tmp_path), "en", 2)
