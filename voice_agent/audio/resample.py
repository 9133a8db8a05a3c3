"""Stateful streaming resampling.

A resampler filters across chunk boundaries, so it must keep state between
chunks: resampling each 20 ms frame on its own restarts the filter and clicks
at every frame edge. One resampler per direction per session.

Integer down-sampling (48 kHz -> 16 kHz, the inbound path; 48 kHz -> 8 kHz,
G.711 out) uses a small windowed-sinc FIR with 0.5 ms of delay and one
output per input chunk: soxr's block-based filters hand audio back in bursts
up to a frame late, which would delay end-of-speech detection. For the same
reason the inbound path up-samples 8 kHz G.711 to 16 kHz with a FIR too
(``low_latency``). Other ratios and uses (TTS 22.05 kHz -> 48 kHz) use
soxr, whose filters are sharper.
"""

from __future__ import annotations

import numpy as np
import soxr

_FIR_TAPS_PER_FACTOR = 16


def _lowpass(factor: int) -> np.ndarray:
    taps = _FIR_TAPS_PER_FACTOR * factor + 1
    n = np.arange(taps) - (taps - 1) / 2
    cutoff = 0.9 / factor  # pass band to 90 % of the new Nyquist frequency
    kernel: np.ndarray = cutoff * np.sinc(cutoff * n) * np.blackman(taps)
    normalized: np.ndarray = (kernel / kernel.sum()).astype(np.float32)
    return normalized


class _FirDecimator:
    def __init__(self, factor: int) -> None:
        self._factor = factor
        self._kernel = _lowpass(factor)
        self._history = np.zeros(len(self._kernel) - 1, dtype=np.float32)
        self._phase = 0  # index, in the next chunk, of the next sample to keep

    def process(self, samples: np.ndarray) -> np.ndarray:
        signal = np.concatenate((self._history, samples.astype(np.float32)))
        filtered = np.convolve(signal, self._kernel, mode="valid")
        kept = filtered[self._phase :: self._factor]
        self._phase = (self._phase - len(filtered)) % self._factor
        self._history = signal[len(signal) - len(self._history) :]
        return np.clip(np.rint(kept), -32768, 32767).astype(np.int16)

    def reset(self) -> None:
        self._history[:] = 0
        self._phase = 0


class _FirInterpolator:
    """Up-sampling by an integer factor: zero-stuffing, then the same
    low-pass (scaled by the factor, which the stuffed zeros take away)."""

    def __init__(self, factor: int) -> None:
        self._factor = factor
        self._kernel = _lowpass(factor) * factor
        self._history = np.zeros(len(self._kernel) - 1, dtype=np.float32)

    def process(self, samples: np.ndarray) -> np.ndarray:
        stuffed = np.zeros(len(samples) * self._factor, dtype=np.float32)
        stuffed[:: self._factor] = samples
        signal = np.concatenate((self._history, stuffed))
        filtered = np.convolve(signal, self._kernel, mode="valid")
        self._history = signal[len(signal) - len(self._history) :]
        return np.clip(np.rint(filtered), -32768, 32767).astype(np.int16)

    def reset(self) -> None:
        self._history[:] = 0


class StreamResampler:
    """Mono int16 stream resampler that keeps filter state across chunks."""

    def __init__(self, in_rate: int, out_rate: int, low_latency: bool = False) -> None:
        """``low_latency``: integer up-sampling by the FIR as well (one
        output per input chunk), not soxr."""
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._fir: _FirDecimator | _FirInterpolator | None = None
        self._soxr: soxr.ResampleStream | None = None
        if in_rate != out_rate and in_rate % out_rate == 0:
            self._fir = _FirDecimator(in_rate // out_rate)
        elif low_latency and in_rate != out_rate and out_rate % in_rate == 0:
            self._fir = _FirInterpolator(out_rate // in_rate)
        elif in_rate != out_rate:
            # "HQ" keeps soxr's filter delay to a few milliseconds at these rates.
            self._soxr = soxr.ResampleStream(in_rate, out_rate, 1, "int16", "HQ")

    def process(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        """Resample the next chunk; ``last=True`` drains what the filter holds."""
        if samples.dtype != np.int16:
            raise TypeError(f"expected int16 samples, got {samples.dtype}")
        if self._fir is not None:
            return self._fir.process(samples)
        if self._soxr is not None:
            out: np.ndarray = self._soxr.resample_chunk(samples, last=last)
            if last:
                self._soxr.clear()
            return out
        return samples

    def reset(self) -> None:
        """Forget the filter state (after a flush the next chunk is a new stream)."""
        if self._fir is not None:
            self._fir.reset()
        if self._soxr is not None:
            self._soxr.clear()
