"""Whisper's log-mel spectrogram in numpy: what Whisper's encoder hears,
and Smart Turn, which was trained on Whisper's features.

Our own, rather than faster-whisper's extractor, so that a process that
only judges turns (a media worker) never imports faster-whisper, and with
it CTranslate2, the tokenizers library and the Hugging Face hub client:
about 10 MB of memory in every such process, and their import time.
"""

from __future__ import annotations

import numpy as np

RATE = 16_000
N_FFT = 400  # 25 ms windows
HOP = 160  # 10 ms apart: 100 frames a second
# Slaney's mel scale: linear up to 1 kHz, logarithmic above it.
_LINEAR_HZ_PER_MEL = 200.0 / 3.0
_LOG_FROM_HZ = 1000.0
_LOG_FROM_MEL = _LOG_FROM_HZ / _LINEAR_HZ_PER_MEL
_LOG_STEP = np.log(6.4) / 27.0  # a mel above 1 kHz, in natural-log Hz
_FLOOR = 1e-10  # power below this is silence
_DYNAMIC_RANGE = 8.0  # log10 units kept below the loudest bin (80 dB)


def hz_to_mel(hz: np.ndarray) -> np.ndarray:
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz / _LINEAR_HZ_PER_MEL
    logarithmic = _LOG_FROM_MEL + np.log(np.maximum(hz, _LOG_FROM_HZ) / _LOG_FROM_HZ) / _LOG_STEP
    return np.where(hz >= _LOG_FROM_HZ, logarithmic, linear)


def mel_to_hz(mel: np.ndarray) -> np.ndarray:
    mel = np.asarray(mel, dtype=np.float64)
    linear = mel * _LINEAR_HZ_PER_MEL
    logarithmic = _LOG_FROM_HZ * np.exp(_LOG_STEP * (mel - _LOG_FROM_MEL))
    return np.where(mel >= _LOG_FROM_MEL, logarithmic, linear)


def mel_filters(n_mels: int, rate: int = RATE, n_fft: int = N_FFT) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) triangles, evenly spaced in mels from 0 Hz
    to the Nyquist frequency, each scaled to the same area (Slaney's
    normalisation): librosa's defaults, which Whisper's features use."""
    edges = mel_to_hz(np.linspace(0.0, hz_to_mel(np.array(rate / 2)), n_mels + 2))
    bins = np.fft.rfftfreq(n_fft, d=1.0 / rate)
    low, centre, high = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins - low) / (centre - low)
    falling = (high - bins) / (high - centre)
    triangles = np.maximum(0.0, np.minimum(rising, falling))
    filters: np.ndarray = (triangles * (2.0 / (high - low))).astype(np.float32)
    return filters


class LogMel:
    """Whisper's features of samples at 16 kHz (floats, full scale 1.0): a frame
    every 10 ms (the clip's end padded with ``padding`` zeros first; the
    last frame, centred past the end, dropped), log10 power in ``n_mels``
    bands, floored 80 dB below the loudest and scaled to about [-1, 1]."""

    def __init__(self, n_mels: int = 80) -> None:
        self.n_mels = n_mels
        self._filters = mel_filters(n_mels)
        # Periodic Hann, as torch.hann_window, which Whisper was trained with.
        self._window = np.hanning(N_FFT + 1)[:-1].astype(np.float32)

    def __call__(self, samples: np.ndarray, padding: int = HOP) -> np.ndarray:
        audio = np.asarray(samples, dtype=np.float32)
        if padding:
            audio = np.pad(audio, (0, padding))
        # Frames centred on multiples of the hop: the edges mirrored.
        centred = np.pad(audio, N_FFT // 2, mode="reflect")
        frames = np.lib.stride_tricks.sliding_window_view(centred, N_FFT)[::HOP][:-1]
        # Laid out and rounded as Whisper's own extractors do, (bands, frames)
        # in single precision: the encoder is sensitive enough that a last
        # bit's difference can change a borderline word.
        spectrum = np.fft.rfft(frames * self._window, axis=1).T.astype(np.complex64)
        power = np.abs(spectrum) ** 2
        log_power = np.log10(np.maximum(self._filters @ power, _FLOOR))
        log_power = np.maximum(log_power, log_power.max() - _DYNAMIC_RANGE)
        features: np.ndarray = ((log_power + 4.0) / 4.0).astype(np.float32)
        return features
