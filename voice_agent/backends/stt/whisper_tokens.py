"""Whisper's special tokens and text decoding, read from the model's own
``tokenizer.json``.

The STT process needs only this much of a tokenizer: the prompt that starts
a transcript, the ids the decoder stops and timestamps on, and the text of
the tokens it generated. faster-whisper's ``Tokenizer`` wraps the same
``tokenizers`` object, but importing faster-whisper also loads CTranslate2
(its 9 MB library, mapped in the models' process for nothing where both
halves of Whisper run on ONNX Runtime), PyAV and the Hugging Face hub
client; so the service keeps its own few lines.
"""

from __future__ import annotations

from collections.abc import Sequence

import tokenizers

# The multilingual models' vocabulary; English-only models have 51,864.
MULTILINGUAL_VOCABULARY = 51865


class WhisperTokens:
    """The ids a transcript is prompted and ended with, and its text."""

    def __init__(self, vocabulary: tokenizers.Tokenizer, language: str = "en") -> None:
        self._vocabulary = vocabulary
        self.eot = self._id("<|endoftext|>")
        self.no_timestamps = self._id("<|notimestamps|>")
        # Timestamps follow <|notimestamps|> in every Whisper vocabulary.
        self.timestamp_begin = self.no_timestamps + 1
        # Renamed between the original models and the later ones.
        speechless: int | None = vocabulary.token_to_id("<|nospeech|>")
        self.no_speech = speechless if speechless is not None else self._id("<|nocaptions|>")
        start = self._id("<|startoftranscript|>")
        self.multilingual = bool(vocabulary.get_vocab_size() >= MULTILINGUAL_VOCABULARY)
        if self.multilingual:
            # A multilingual model is told the language and the task; an
            # English-only one has neither token in its prompt.
            # The language tokens lie between <|startoftranscript|> and
            # <|translate|>: any other special token would corrupt the prompt.
            language_id: int | None = vocabulary.token_to_id(f"<|{language}|>")
            if language_id is None or not start < language_id < self._id("<|translate|>"):
                raise ValueError(f"Whisper has no language {language!r}")
            self.sot_sequence = [start, language_id, self._id("<|transcribe|>")]
        else:
            self.sot_sequence = [start]

    def _id(self, token: str) -> int:
        # Typed here: some tokenizers releases ship no type information.
        found: int | None = self._vocabulary.token_to_id(token)
        if found is None:
            raise ValueError(f"not a Whisper vocabulary: it has no {token}")
        return found

    def decode(self, tokens: Sequence[int]) -> str:
        """The text of the tokens, the special and timestamp ones left out."""
        return str(self._vocabulary.decode([token for token in tokens if token < self.eot]))
