"""Streaming resampling stays continuous across 20 ms frame boundaries."""

from __future__ import annotations

import numpy as np
import pytest

from voice_agent.audio.resample import StreamResampler


def sine(rate: int, seconds: float, freq: float = 440.0, amplitude: float = 16000) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amplitude * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def stream(resampler: StreamResampler, samples: np.ndarray, chunk: int) -> np.ndarray:
    pieces = [
        resampler.process(samples[i : i + chunk], last=i + chunk >= len(samples))
        for i in range(0, len(samples), chunk)
    ]
    return np.concatenate(pieces)


@pytest.mark.parametrize(
    ("in_rate", "out_rate", "low_latency"),
    [
        (48_000, 16_000, False),
        (22_050, 48_000, False),
        (48_000, 8_000, False),  # G.711 out
        (8_000, 16_000, True),  # G.711 in
        (8_000, 16_000, False),
    ],
)
def test_sine_is_continuous_across_20ms_frames(
    in_rate: int, out_rate: int, low_latency: bool
) -> None:
    signal = sine(in_rate, 1.0)
    resampler = StreamResampler(in_rate, out_rate, low_latency)
    out = stream(resampler, signal, chunk=in_rate // 50)
    assert abs(len(out) - out_rate) <= out_rate // 100  # nothing lost or duplicated
    body = out[out_rate // 20 : -out_rate // 20].astype(np.float64)
    # A clean 440 Hz sine never jumps more than amplitude * 2*pi*f/rate per sample;
    # a filter restarted at each frame edge would.
    max_step = 16000 * 2 * np.pi * 440 / out_rate
    assert np.abs(np.diff(body)).max() <= max_step * 1.05
    # And the level is preserved (no dropouts at the edges).
    rms = np.sqrt(np.mean(body**2))
    assert rms == pytest.approx(16000 / np.sqrt(2), rel=0.02)


def test_low_latency_up_sampling_gives_one_output_per_input_frame() -> None:
    """The inbound path's FIR: every 20 ms in gives 20 ms out, at once."""
    resampler = StreamResampler(8_000, 16_000, low_latency=True)
    signal = sine(8_000, 0.2)
    assert [len(resampler.process(signal[i : i + 160])) for i in range(0, 1600, 160)] == [320] * 10


def test_stateless_per_frame_resampling_would_click() -> None:
    """The check above detects the defect it guards against."""
    signal = sine(48_000, 0.5)
    naive = np.concatenate(
        [
            StreamResampler(48_000, 16_000).process(signal[i : i + 960])
            for i in range(0, 24_000, 960)
        ]
    ).astype(np.float64)
    max_step = 16000 * 2 * np.pi * 440 / 16_000
    assert np.abs(np.diff(naive[800:-800])).max() > max_step * 1.5


def test_rejects_non_int16() -> None:
    with pytest.raises(TypeError):
        StreamResampler(48_000, 16_000).process(np.zeros(10, dtype=np.float32))
