"""``--stt-decoder onnx``: Whisper's decoder on ONNX Runtime, built at start-up
from the packaged CTranslate2 weights, must hear what CTranslate2 hears."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.audio_data import librivox, reference, word_error_rate
from voice_agent.backends import whisper_weights
from voice_agent.backends.ct2_model_file import Ct2FormatError, read_variables
from voice_agent.backends.stt_faster_whisper import FasterWhisperStt
from voice_agent.backends.whisper_onnx_decoder import quantize_blocks

CLIPS = ["0880", "0930", "0890", "0920", "0870"]
Runtimes = tuple[FasterWhisperStt, FasterWhisperStt]


@pytest.fixture
def runtimes() -> Iterator[Runtimes]:
    """The ONNX decoder and CTranslate2's, each with its own model."""
    onnx = FasterWhisperStt("base", "en", 2, decoder="onnx")
    ct2 = FasterWhisperStt("base", "en", 2, decoder="ctranslate2")
    yield onnx, ct2
    onnx.close()
    ct2.close()


async def test_each_clip_is_heard_word_for_word_as_ctranslate2_hears_it(runtimes: Runtimes) -> None:
    onnx, ct2 = runtimes
    for clip in CLIPS:
        text = await onnx.transcribe(librivox(clip))
        assert text == await ct2.transcribe(librivox(clip)), clip
        assert word_error_rate(reference(clip), text) <= 0.15, (clip, text)


async def test_a_batch_of_callers_is_decoded_as_each_alone(runtimes: Runtimes) -> None:
    onnx, ct2 = runtimes
    clips = ["0890", "0920", "0870"]
    together = await asyncio.gather(*(onnx.transcribe(librivox(c)) for c in clips))
    alone = [await ct2.transcribe(librivox(c)) for c in clips]
    assert together == alone
    assert onnx.stats()["max_batch_seen"] == 3


async def test_silence_and_noise_give_no_words(runtimes: Runtimes) -> None:
    onnx, ct2 = runtimes
    silence = np.zeros(32000, dtype=np.int16)
    noise = (np.random.default_rng(1).normal(0, 300, 32000)).astype(np.int16)
    for audio in (silence, noise):
        assert await onnx.transcribe(audio) == await ct2.transcribe(audio)
    assert await onnx.transcribe(silence) == ""


async def test_a_transcript_nobody_waits_for_stops_decoding() -> None:
    stt = FasterWhisperStt("base", "en", 2, decoder="onnx")
    try:
        task = asyncio.create_task(stt.transcribe(librivox("0870")))
        await asyncio.sleep(0.25)  # encoded (~0.1 s) and decoding (~0.2 s more)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The worker is free again for the next caller, who is heard in full.
        text = await stt.transcribe(librivox("0930"))
        assert word_error_rate(reference("0930"), text) <= 0.15
        stats = stt.stats()
        abandoned = (stats["abandoned_while_decoding"], stats["abandoned_after_encoding"])
        assert abandoned in ((1, 0), (0, 1))
    finally:
        stt.close()


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


def test_the_packaged_model_file_is_read_and_a_foreign_one_refused(tmp_path: Path) -> None:
    weights = read_variables(whisper_weights.resolve("base") / "model.bin")
    assert weights["decoder/embeddings/weight"].shape == (51865, 512)
    # The output projection is an alias of the embeddings, resolved to them.
    assert weights["decoder/projection/weight"] is weights["decoder/embeddings/weight"]
    foreign = tmp_path / "model.bin"
    foreign.write_bytes(struct.pack("<I", 99) + b"\0" * 16)
    with pytest.raises(Ct2FormatError, match="version 99"):
        read_variables(foreign)
