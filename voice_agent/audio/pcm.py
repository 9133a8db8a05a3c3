"""Conversions between the PCM layouts the pipeline meets."""

from __future__ import annotations

import numpy as np


def downmix_interleaved(samples: np.ndarray, channels: int) -> np.ndarray:
    """Average interleaved int16 channels into one int16 channel."""
    if channels == 1:
        return samples.astype(np.int16, copy=False)
    frames = samples.reshape(-1, channels).astype(np.int32)
    mixed: np.ndarray = (frames.sum(axis=1) // channels).astype(np.int16)
    return mixed


def int16_to_float(samples: np.ndarray) -> np.ndarray:
    return (samples.astype(np.float32)) / 32768.0


def float_to_int16(samples: np.ndarray) -> np.ndarray:
    clipped = np.clip(samples, -1.0, 1.0)
    converted: np.ndarray = (clipped * 32767.0).astype(np.int16)
    return converted


def rms_dbfs(samples: np.ndarray) -> float:
    """Loudness of int16 samples in dB relative to full scale (-inf for silence)."""
    if samples.size == 0:
        return float("-inf")
    power = float(np.mean(np.square(samples.astype(np.float64))))
    if power <= 0.0:
        return float("-inf")
    return 10.0 * float(np.log10(power / (32768.0**2)))
