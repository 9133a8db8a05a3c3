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


def sound_onset(samples: np.ndarray, threshold: int, keep: int) -> int | None:
    """Index to start from so that ``keep`` samples precede the first one
    louder than ``threshold``; None when there is no such sample."""
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > threshold)
    if not loud.size:
        return None
    return max(0, int(loud[0]) - keep)


def rms_dbfs(samples: np.ndarray) -> float:
    """Loudness of int16 samples in dB relative to full scale (-inf for silence)."""
    if samples.size == 0:
        return float("-inf")
    power = float(np.mean(np.square(samples.astype(np.float64))))
    if power <= 0.0:
        return float("-inf")
    return 10.0 * float(np.log10(power / (32768.0**2)))
