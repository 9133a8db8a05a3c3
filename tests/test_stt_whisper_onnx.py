"""``--stt-decoder onnx``: Whisper's decoder on ONNX Runtime, built at start-up
from the packaged CTranslate2 weights, must hear what CTranslate2 hears."""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import ctranslate2
import numpy as np
import pytest
from faster_whisper import WhisperModel
from faster_whisper.tokenizer import Tokenizer

from voice_agent.backends.stt import whisper_graph_cache as cache
from voice_agent.backends.stt import whisper_onnx_graphs as graphs
from voice_agent.backends.stt import whisper_weights
from voice_agent.backends.stt.ct2_model_file import Ct2FormatError, read_variables
from voice_agent.backends.stt.whisper import FasterWhisperStt
from voice_agent.backends.stt.whisper_graph_cache import decoder_graphs
from voice_agent.backends.stt.whisper_onnx_decoder import OnnxWhisperDecoder, TokenIds
from voice_agent.backends.stt.whisper_onnx_graphs import quantize_blocks
from voice_agent.testing.audio_data import librivox, reference, word_error_rate, words

CLIPS = ["0880", "0930", "0890", "0920", "0870"]


def word_errors(expected: str, heard: str) -> int:
    """Words substituted, dropped or added (the edit distance in words)."""
    return round(word_error_rate(expected, heard) * max(1, len(words(expected))))


Runtimes = tuple[FasterWhisperStt, FasterWhisperStt]


@pytest.fixture
def runtimes() -> Iterator[Runtimes]:
    """Whisper on ONNX Runtime (the default) and on CTranslate2 alone."""
    onnx = FasterWhisperStt("base", "en", 2)
    ct2 = FasterWhisperStt("base", "en", 2, decoder="ctranslate2", encoder="ctranslate2")
    yield onnx, ct2
    onnx.close()
    ct2.close()


@pytest.mark.models
async def test_each_clip_is_heard_as_ctranslate2_hears_it(runtimes: Runtimes) -> None:
    onnx, ct2 = runtimes
    for clip in CLIPS:
        text = await onnx.transcribe(librivox(clip))
        # The two runtimes' 8-bit products round differently on some CPUs,
        # and a word the model is unsure of may go either way: on an AVX2
        # host CTranslate2 hears "ill-sposed" where the reader says
        # "ill-disposed", and ONNX Runtime hears it right.
        theirs = await ct2.transcribe(librivox(clip))
        assert word_errors(theirs, text) <= 1, (clip, text, theirs)
        assert word_error_rate(reference(clip), text) <= 0.15, (clip, text)


@pytest.mark.models
@pytest.mark.slow
async def test_a_batch_of_callers_is_decoded_as_each_alone(runtimes: Runtimes) -> None:
    onnx, _ = runtimes
    # 0880 and 0930 (3.0 and 3.3 s) share one decoder batch, and their rows
    # end at different steps (13 and 12 tokens); 0870 gets a batch of its own.
    clips = ["0880", "0930", "0930", "0870"]
    together = await asyncio.gather(*(onnx.transcribe(librivox(c)) for c in clips))
    alone = [await onnx.transcribe(librivox(c)) for c in clips]
    # The activations are quantised a batch at a time (one scale for all its
    # rows), so a word the model is unsure of may go either way alone and
    # batched ("ill-disposed" or "ill-sposed" on an AVX2 host); two rows of
    # one clip in one batch are decoded alike.
    assert together[1] == together[2]
    for clip, batched, single in zip(clips, together, alone, strict=True):
        assert word_errors(single, batched) <= 1, (clip, batched, single)
        assert word_error_rate(reference(clip), batched) <= 0.15, (clip, batched)
    assert onnx.stats()["max_batch_seen"] == 4


@pytest.mark.models
async def test_silence_and_noise_give_no_words(runtimes: Runtimes) -> None:
    onnx, ct2 = runtimes
    silence = np.zeros(32000, dtype=np.int16)
    noise = (np.random.default_rng(1).normal(0, 300, 32000)).astype(np.int16)
    for audio in (silence, noise):
        assert await onnx.transcribe(audio) == await ct2.transcribe(audio)
    assert await onnx.transcribe(silence) == ""


@dataclass
class Parts:
    """CTranslate2's Whisper (the encoder and the reference decoder), the
    ONNX decoder, the prompt and one clip's encoder output."""

    ct2: ctranslate2.models.Whisper
    decoder: OnnxWhisperDecoder
    prompt: list[int]
    features: ctranslate2.StorageView
    encoded: np.ndarray


@pytest.fixture(scope="module")
def parts() -> Parts:
    path = whisper_weights.resolve("base")
    model = WhisperModel(str(path), device="cpu", compute_type="int8", cpu_threads=2)
    tokenizer = Tokenizer(model.hf_tokenizer, True, task="transcribe", language="en")
    settings = json.loads((path / "config.json").read_text())
    ids = TokenIds(
        eot=tokenizer.eot,
        no_timestamps=tokenizer.no_timestamps,
        timestamp_begin=tokenizer.timestamp_begin,
        no_speech=tokenizer.no_speech,
    )
    decoder = OnnxWhisperDecoder(
        path, 2, ids, settings["suppress_ids"], settings["suppress_ids_begin"]
    )
    audio = librivox("0870").astype(np.float32) / 32768
    mel = model.feature_extractor(audio)
    frames = mel.shape[1] + 100 + (mel.shape[1] % 2)
    padded = np.zeros((1, mel.shape[0], frames), dtype=np.float32)
    padded[0, :, : mel.shape[1]] = mel
    features = ctranslate2.StorageView.from_array(padded)
    encoded = np.asarray(model.model.encode(features, to_cpu=True))
    return Parts(model.model, decoder, list(tokenizer.sot_sequence), features, encoded)


@pytest.mark.parametrize("max_length", [8, 13, 30, 100])
@pytest.mark.models
def test_the_length_limit_cuts_where_ctranslate2_cuts(parts: Parts, max_length: int) -> None:
    (expected,) = parts.ct2.generate(
        parts.features,
        [parts.prompt],
        beam_size=1,
        max_length=max_length,
        return_no_speech_prob=True,
        suppress_blank=True,
        suppress_tokens=[-1],
    )
    decoded = parts.decoder.generate(parts.encoded, parts.prompt, max_length)
    assert decoded is not None
    assert decoded[0].tokens == expected.sequences_ids[0]
    assert abs(decoded[0].no_speech_prob - expected.no_speech_prob) < 0.01


@pytest.mark.models
def test_decoding_stops_between_steps_once_nobody_waits(parts: Parts) -> None:
    asked = 0

    def stop() -> bool:
        nonlocal asked
        asked += 1
        return asked > 3

    assert parts.decoder.generate(parts.encoded, parts.prompt, 100, stop=stop) is None
    assert asked == 4  # three tokens decoded, then asked once more, and no further
    # The session pair went back to the pool: the next transcript is whole.
    decoded = parts.decoder.generate(parts.encoded, parts.prompt, 100)
    assert decoded is not None and len(decoded[0].tokens) > 20


@pytest.mark.models
def test_a_prompt_without_timestamps_is_refused(parts: Parts) -> None:
    with pytest.raises(ValueError, match="timestamps"):
        parts.decoder.generate(parts.encoded, [*parts.prompt, 50363], 100)  # <|notimestamps|>


def test_eight_bit_blocks_keep_every_weight_within_half_a_step() -> None:
    weight = np.random.default_rng(0).normal(0, 0.05, (64, 96)).astype(np.float32)
    weight[3, :32] = 0.0  # an all-zero block must not divide by zero
    packed, scales = quantize_blocks(weight)
    assert packed.shape == (64, 3, 32) and packed.dtype == np.uint8
    step = scales.reshape(64, 3, 1)
    restored = ((packed.astype(np.float32) - 128) * step).reshape(64, 96)
    half_step = np.repeat(step, 32, axis=2).reshape(64, 96) / 2
    assert np.all(np.abs(restored - weight) <= half_step + 1e-7)
    assert np.all(restored[3, :32] == 0.0)


@pytest.mark.models
def test_the_packaged_model_file_is_read_and_a_foreign_one_refused(tmp_path: Path) -> None:
    weights = read_variables(whisper_weights.resolve("base") / "model.bin")
    assert weights["decoder/embeddings/weight"].shape == (51865, 512)
    # The output projection is an alias of the embeddings, resolved to them.
    assert weights["decoder/projection/weight"] is weights["decoder/embeddings/weight"]
    foreign = tmp_path / "model.bin"
    foreign.write_bytes(struct.pack("<I", 99) + b"\0" * 16)
    with pytest.raises(Ct2FormatError, match="version 99"):
        read_variables(foreign)


@pytest.mark.models
def test_the_decoder_graphs_are_built_once_and_again_for_another_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_file = whisper_weights.resolve("base") / "model.bin"
    built = decoder_graphs(model_file, cache=tmp_path)
    assert len(list((tmp_path / cache.CACHE_FOLDER).glob("*.onnx"))) == 2

    def never(*args: object) -> None:
        raise AssertionError("built again")

    monkeypatch.setattr(cache, "read_variables", never)  # from disk: no weights read
    assert decoder_graphs(model_file, cache=tmp_path) == built
    monkeypatch.undo()
    monkeypatch.setattr(graphs, "build_step_graph", never)
    other = tmp_path / "other-model.bin"  # another model's file: not the same graphs
    other.write_bytes(model_file.read_bytes() + b"\0")
    with pytest.raises(AssertionError, match="built again"):
        decoder_graphs(other, cache=tmp_path)
