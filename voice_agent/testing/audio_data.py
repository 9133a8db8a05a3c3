"""Recorded human speech for the tests and benchmarks (CMU Sphinx test
data, BSD licence: see tests/data/COPYING.pocketsphinx; Asterisk's
telephone prompts, CC-BY-SA 3.0: tests/data/asterisk/COPYING), and the
measures taken on it (word error rate, where the speech starts and ends).

The recordings are not part of the package: they stay in the checkout's
``tests/data``, found from this file's place in the checkout. Reading one
without that folder (this package installed from a wheel) raises
FileNotFoundError saying so; the measures need no files."""

from __future__ import annotations

import re
import wave
from pathlib import Path

import numpy as np
import soxr

from voice_agent.testing.checkout import in_checkout

RATE = 16_000


def data_file(name: str) -> Path:
    """A file of ``tests/data``; FileNotFoundError, saying why, without the folder."""
    return in_checkout("tests/data") / name


def librivox(clip: str) -> np.ndarray:
    """16 kHz mono int16 samples of one LibriVox test recording."""
    with wave.open(str(data_file(f"sense_and_sensibility_01_austen_64kb-{clip}.wav"))) as handle:
        assert handle.getframerate() == RATE and handle.getnchannels() == 1
        return np.frombuffer(handle.readframes(handle.getnframes()), dtype=np.int16).copy()


def goforward() -> np.ndarray:
    """ "go forward ten meters", 16 kHz mono int16 raw."""
    return np.fromfile(data_file("goforward.raw"), dtype="<i2").astype(np.int16)


def reference(clip: str) -> str:
    """What is said in LibriVox recording ``clip``, as transcribed."""
    for line in data_file("transcription").read_text().splitlines():
        match = re.match(r"<s> (.*) </s> \((.*)\)", line.strip())
        if match and match.group(2).endswith(clip):
            return match.group(1)
    raise KeyError(clip)


def silence(seconds: float) -> np.ndarray:
    """``seconds`` of digital silence, 16 kHz int16."""
    return np.zeros(int(seconds * RATE), dtype=np.int16)


def words(text: str) -> list[str]:
    """``text`` as the words a transcript is scored on: lower case, no punctuation."""
    text = text.lower().replace("-", " ").replace("mr.", "mister")
    return re.sub(r"[^a-z' ]", " ", text).split()


def word_error_rate(reference_text: str, hypothesis: str) -> float:
    """Word-level edit distance over the reference's length (0 when equal)."""
    ref, hyp = words(reference_text), words(hypothesis)
    dist = list(range(len(hyp) + 1))
    for i in range(1, len(ref) + 1):
        prev, dist[0] = dist[0], i
        for j in range(1, len(hyp) + 1):
            cur = min(dist[j] + 1, dist[j - 1] + 1, prev + (ref[i - 1] != hyp[j - 1]))
            prev, dist[j] = dist[j], cur
    return dist[len(hyp)] / max(1, len(ref))


def heard_as_its_own(clip: str, transcript: str, clips: list[str]) -> bool:
    """A concurrent caller's transcript is theirs and intelligible: closer to
    its own clip than to any other caller's, within 0.3 word error rate.
    (Whisper base hears 0880's "ill-disposed" as "ill-sposed" or "old
    supposed", one or two errors in eight words, depending on the host: the
    same code passed at 0.2 on one machine and failed on the next.)"""
    own = word_error_rate(reference(clip), transcript)
    others = [word_error_rate(reference(c), transcript) for c in clips if c != clip]
    return own <= 0.3 and all(own < other for other in others)


def speech_bounds(samples: np.ndarray, threshold_db: float = -35.0) -> tuple[float, float]:
    """First and last 10 ms window (in seconds) louder than ``threshold_db``."""
    loud = np.nonzero(levels_db(samples) > threshold_db)[0]
    return loud[0] / 100.0, (loud[-1] + 1) / 100.0


def levels_db(samples: np.ndarray) -> np.ndarray:
    """The level of each 10 ms window, in dB below full scale."""
    window = RATE // 100
    frames = samples[: len(samples) // window * window].reshape(-1, window).astype(np.float64)
    levels: np.ndarray = 10 * np.log10(np.mean(frames**2, axis=1) / 32768.0**2 + 1e-12)
    return levels


def with_pause(samples: np.ndarray, pause_s: float, threshold_db: float = -35.0) -> np.ndarray:
    """The recording with a pause of ``pause_s`` in the middle of it: the
    quietest gap between words in its middle fifth (every 10 ms window
    there below ``threshold_db``) becomes exactly ``pause_s`` of silence."""
    levels = levels_db(samples)
    middle = slice(len(levels) * 2 // 5, len(levels) * 3 // 5)
    quietest = middle.start + int(np.argmin(levels[middle]))
    start, end = quietest, quietest + 1
    while start > 0 and levels[start - 1] < threshold_db:
        start -= 1
    while end < len(levels) and levels[end] < threshold_db:
        end += 1
    window = RATE // 100
    return np.concatenate((samples[: start * window], silence(pause_s), samples[end * window :]))


# Telephone prompts recorded by Allison Smith (Asterisk's core sounds, 8 kHz,
# CC-BY-SA 3.0: see tests/data/asterisk/COPYING), with their published text.
ASTERISK = {
    "please-try-call-later": "Please try your call again later.",
    "check-number-dial-again": "Please check the number and dial again.",
    "enter-num-blacklist": "Please enter the number to be blacklisted.",
    "confbridge-lock-out": "to lock, or unlock the conference.",
}


def telephone_prompt(name: str) -> np.ndarray:
    """16 kHz mono int16 samples of one 8 kHz prompt, trimmed as a turn is:
    0.3 s before the speech, 0.1 s after it."""
    with wave.open(str(data_file(f"asterisk/{name}.wav"))) as handle:
        assert handle.getframerate() == 8000 and handle.getnchannels() == 1
        narrow = np.frombuffer(handle.readframes(handle.getnframes()), dtype=np.int16)
    wide: np.ndarray = soxr.resample(narrow, 8000, RATE).astype(np.int16)
    start, end = speech_bounds(wide)
    return wide[max(0, int((start - 0.3) * RATE)) : int((end + 0.1) * RATE)]


def noise_burst(ms: int = 200, dbfs: float = -25.0, seed: int = 7) -> np.ndarray:
    """A cough-like burst: pink noise in the voice band (200 Hz-4 kHz), a
    10 ms attack and an 80 ms decay, ``dbfs`` RMS. WebRTC's VAD takes most
    of it for speech, as it does a cough."""
    count = RATE * ms // 1000
    spectrum = np.fft.rfft(np.random.default_rng(seed).standard_normal(count))
    freqs = np.fft.rfftfreq(count, 1 / RATE)
    spectrum[1:] /= np.sqrt(freqs[1:])
    spectrum[(freqs < 200) | (freqs > 4000)] = 0
    noise = np.fft.irfft(spectrum, count)
    ramp = np.arange(count)
    noise *= np.minimum(1.0, ramp / (0.01 * RATE)) * np.exp(-ramp / (0.08 * RATE))
    noise *= 32768 * 10 ** (dbfs / 20) / np.sqrt(np.mean(noise**2))
    return np.clip(noise, -32768, 32767).astype(np.int16)
