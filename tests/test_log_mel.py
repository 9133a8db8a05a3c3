"""Our Whisper log-mel features against faster-whisper's extractor (the
features Whisper and Smart Turn were trained on), and the media workers'
modules free of faster-whisper."""

from __future__ import annotations

import numpy as np
import pytest
from faster_whisper.feature_extractor import FeatureExtractor

from tests.imports import left_imported
from voice_agent.audio.log_mel import LogMel, hz_to_mel, mel_filters, mel_to_hz
from voice_agent.testing.audio_data import librivox


def clips() -> list[np.ndarray]:
    speech = librivox("0880").astype(np.float32) / 32768.0
    noise = np.random.default_rng(7).standard_normal(128_000).astype(np.float32) * 0.1
    quiet = np.zeros(16_000, dtype=np.float32)
    quiet[8_000:8_400] = 0.5  # a click in digital silence: the 80 dB floor decides
    return [speech, speech[:12_345], speech[4_000:4_050], noise, quiet]


@pytest.mark.parametrize("n_mels", [80, 128])
def test_the_filters_are_whispers(n_mels: int) -> None:
    expected = FeatureExtractor(feature_size=n_mels).mel_filters
    np.testing.assert_allclose(mel_filters(n_mels), expected, rtol=1e-6, atol=1e-9)


def test_the_mel_scale_turns_at_one_kilohertz() -> None:
    hz = np.array([0.0, 500.0, 1000.0, 4000.0, 8000.0])
    np.testing.assert_allclose(mel_to_hz(hz_to_mel(hz)), hz, rtol=1e-9)
    assert hz_to_mel(np.array(1000.0)) == pytest.approx(15.0)  # 1000 / (200 / 3)
    # Above 1 kHz each mel is the same ratio of frequencies (6.4 ** (1 / 27)).
    step = mel_to_hz(np.array([30.0, 31.0]))
    assert step[1] / step[0] == pytest.approx(6.4 ** (1 / 27))


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("padding", [0, 160])
def test_the_features_are_whispers(n_mels: int, padding: int) -> None:
    reference = FeatureExtractor(feature_size=n_mels)
    ours = LogMel(n_mels)
    for clip in clips():
        if len(clip) + padding <= 200:
            continue  # too short to mirror at the edges: see below
        expected = reference(clip, padding=padding)
        got = ours(clip, padding=padding)
        assert got.shape == expected.shape == (n_mels, (len(clip) + padding) // 160)
        assert got.dtype == np.float32
        # Bit for bit: the encoder can turn a last bit into another word.
        np.testing.assert_array_equal(got, expected)


def test_a_media_workers_modules_leave_faster_whisper_out() -> None:
    # A worker judges turns (Smart Turn hears these features) but never
    # transcribes: faster-whisper would bring CTranslate2, tokenizers and
    # the hub client into every worker.
    code = (
        "import voice_agent.server.worker, voice_agent.backends.turn.smart_turn\n"
        "import voice_agent.backends.vad.webrtc\n"
    )
    heavy = ("faster_whisper", "ctranslate2", "tokenizers", "huggingface_hub")
    assert left_imported(code, heavy, timeout_s=60) == []


def test_a_clip_too_short_to_mirror_is_refused_as_whispers_is() -> None:
    clip = np.zeros(50, dtype=np.float32)
    with pytest.raises(ValueError):
        FeatureExtractor()(clip, padding=0)
    with pytest.raises(ValueError):
        LogMel()(clip, padding=0)
    assert LogMel()(clip).shape == (80, 1)  # the STT's padding makes it long enough
