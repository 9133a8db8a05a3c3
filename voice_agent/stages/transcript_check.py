"""Whether a fast transcript can be trusted, and guards against the STT's
hallucinations.

A fast decode (Whisper's trimmed window, say) is usually right, but when it
is wrong it fails in recognisable ways: no words from audio the VAD called
speech, a repetition loop, a transcript the decoder's length limit cut
mid-word, or low confidence. Such a transcript is decoded again the safe way
before the turn is answered. The checks are text and evidence only, so every
STT backend shares them.
"""

from __future__ import annotations

import re
import zlib

from voice_agent.backends.capabilities import (
    LOGPROB_THRESHOLD,
    NO_SPEECH_THRESHOLD,
    Transcription,
)

# Whisper's gzip compression-ratio check for loops.
COMPRESSION_RATIO_THRESHOLD = 2.4
# A short phrase said this many times in a row is a loop ("please, please,
# please, please"); people say "no, no, no", so one word needs a run of four,
# a phrase of two to four words a run of three.
WORD_RUN = 4
PHRASE_RUN = 3
LONGEST_RUN_NGRAM = 4
# A phrase this long said twice is a loop too ("Please check the number
# and dial again. Please check the number and dial").
LONG_REPEAT_WORDS = 5
# Below this much voiced audio a turn with no words is taken for a noise
# (a cough, a click), not for speech nobody understood.
MIN_SPEECH_MS = 300


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


def compression_ratio(text: str) -> float:
    """Whisper's loop detector: repeated text compresses well."""
    data = text.encode()
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _loop_start(words: list[str]) -> int | None:
    """Index of the word where a repetition loop starts (its second
    occurrence), or None."""
    for n in range(1, LONGEST_RUN_NGRAM + 1):
        run = WORD_RUN if n == 1 else PHRASE_RUN
        for start in range(len(words) - n * run + 1):
            gram = words[start : start + n]
            if all(words[start + k * n : start + (k + 1) * n] == gram for k in range(run)):
                return start + n
    seen: dict[tuple[str, ...], int] = {}
    for start in range(len(words) - LONG_REPEAT_WORDS + 1):
        first = seen.setdefault(tuple(words[start : start + LONG_REPEAT_WORDS]), start)
        if start - first >= LONG_REPEAT_WORDS:
            return start
    return None


def has_loop(text: str) -> bool:
    if _loop_start(_words(text)) is not None:
        return True
    return len(text) > 40 and compression_ratio(text) > COMPRESSION_RATIO_THRESHOLD


def garbled(text: str) -> bool:
    """Mostly marks, few letters: "Un-------------"."""
    visible = [c for c in text if not c.isspace()]
    return bool(visible) and sum(c.isalnum() for c in visible) < len(visible) / 2


def without_loop(text: str) -> str:
    """The text up to where a repetition loop begins (its first
    occurrence kept), for a transcript that loops even the safe way."""
    tokens = text.split()
    start = _loop_start(_words(text))
    if start is None:
        return text
    # Map the word index back onto the original tokens (punctuation kept).
    kept: list[str] = []
    count = 0
    for token in tokens:
        bare = _words(token)
        if count + len(bare) > start:
            break
        kept.append(token)
        count += len(bare)
    return " ".join(kept).rstrip(",;:")


def nobody_spoke(transcription: Transcription) -> bool:
    """The model's own belief that the audio holds no speech."""
    no_speech = transcription.no_speech_prob
    return no_speech is not None and no_speech > NO_SPEECH_THRESHOLD


def hallucinated(transcription: Transcription, voiced_ms: int) -> bool:
    """Words the model itself believes nobody said, from audio the VAD
    barely called speech: Whisper's invented phrases on a cough or a hum."""
    return voiced_ms < MIN_SPEECH_MS and nobody_spoke(transcription)


def distrust(transcription: Transcription, voiced_ms: int) -> str | None:
    """Why a transcript should be decoded again the safe way, or None to
    trust it. ``voiced_ms`` is how much of the turn the VAD called speech."""
    text = transcription.text.strip()
    speech = voiced_ms >= MIN_SPEECH_MS
    if not text:
        if not speech:
            return None
        return "no_speech" if nobody_spoke(transcription) else "empty"
    if hallucinated(transcription, voiced_ms):
        return "no_speech"
    if has_loop(text):
        return "repetition"
    if garbled(text):
        return "garbled"
    if transcription.truncated:
        return "truncated"
    logprob = transcription.avg_logprob
    if logprob is not None and logprob < LOGPROB_THRESHOLD:
        return "low_confidence"
    return None
