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
# A stretch this long read again to the end is a loop too ("Please check the
# number and dial again. Please check the number and dial").
LONG_REPEAT_WORDS = 5
# Below this much voiced audio a turn with no words is taken for a noise
# (a cough, a click), not for speech nobody understood.
MIN_SPEECH_MS = 300


def _words(text: str) -> list[str]:
    return re.findall(r"[\w']+", text.lower())


def compression_ratio(text: str) -> float:
    """Whisper's loop detector: repeated text compresses well."""
    data = text.encode()
    return len(data) / len(zlib.compress(data)) if data else 0.0


def _repeats_to_end(words: list[str], start: int, n: int) -> bool:
    return all(words[i] == words[start + (i - start) % n] for i in range(start, len(words)))


def _loop_start(words: list[str]) -> int | None:
    """Index of the word where a repetition loop's second occurrence
    begins, or None. Whisper's loops run to the end of the transcript (the
    length limit stops them); a repeat the speaker moves on from ("yes, yes,
    yes, yes, that's right", a correction) is speech, not a loop."""
    end = len(words)
    for n in range(1, LONGEST_RUN_NGRAM + 1):
        run = WORD_RUN if n == 1 else PHRASE_RUN
        for start in range(end - n * run + 1):
            if _repeats_to_end(words, start, n):
                return start + n
    # A longer stretch read again from an earlier point, to the end.
    for first in range(end):
        for second in range(first + LONG_REPEAT_WORDS, end - LONG_REPEAT_WORDS + 1):
            if words[second:] == words[first : first + end - second]:
                return second
    return None


def has_loop(text: str) -> bool:
    if _loop_start(_words(text)) is not None:
        return True
    return len(text) > 40 and compression_ratio(text) > COMPRESSION_RATIO_THRESHOLD


def garbled(text: str) -> bool:
    """Marks where words should be: a run of one mark ("Un-------------"),
    or marks and no letter or digit at all."""
    if re.search(r"([^\w\s])\1{3,}", text):
        return True
    return bool(text.strip()) and not any(c.isalpha() or c.isdigit() for c in text)


def without_loop(text: str) -> str:
    """The text up to where a repetition loop starts again (its first
    occurrence kept), for a transcript that loops even the safe way."""
    tokens = text.split()
    start = _loop_start(_words(text))
    if start is None:
        return text
    # Map the word index back onto the original tokens (punctuation kept);
    # a token holding several words ("ha-ha-ha-ha") is kept whole.
    kept: list[str] = []
    count = 0
    for token in tokens:
        if count >= start:
            break
        kept.append(token)
        count += len(_words(token))
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
