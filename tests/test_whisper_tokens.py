"""Whisper's special tokens and decoding (backends/stt/whisper_tokens.py) on
the packaged models' own vocabularies, against faster-whisper's tokenizer,
which the service no longer imports unless a half of Whisper runs on
CTranslate2."""

from __future__ import annotations

import pytest
import tokenizers
from faster_whisper.tokenizer import Tokenizer

from tests.imports import left_imported
from voice_agent.backends.stt import whisper_weights
from voice_agent.backends.stt.whisper_tokens import WhisperTokens

SAID = " He was not an ill-disposed young man, 42% of the time."


def _vocabulary(model: str) -> tokenizers.Tokenizer:
    return tokenizers.Tokenizer.from_file(str(whisper_weights.resolve(model) / "tokenizer.json"))


@pytest.mark.parametrize(("model", "language"), [("base", "en"), ("base", "de"), ("tiny.en", "en")])
def test_the_ids_and_the_text_are_faster_whispers(model: str, language: str) -> None:
    vocabulary = _vocabulary(model)
    ours = WhisperTokens(vocabulary, language)
    multilingual = model == "base"
    theirs = Tokenizer(vocabulary, multilingual, task="transcribe", language=language)
    assert ours.multilingual is multilingual
    assert ours.sot_sequence == theirs.sot_sequence
    assert len(ours.sot_sequence) == (3 if multilingual else 1)
    for name in ("eot", "no_timestamps", "timestamp_begin", "no_speech"):
        assert getattr(ours, name) == getattr(theirs, name), name
    # What the decoder gives back: the prompt, a timestamp, the words, a
    # timestamp, the end; only the words are text.
    words = theirs.encode(SAID)
    generated = [
        *theirs.sot_sequence,
        theirs.timestamp_begin,
        *words,
        theirs.timestamp_begin + 150,
        theirs.eot,
    ]
    assert ours.decode(generated) == theirs.decode(generated) == SAID


@pytest.mark.parametrize("language", ["xx", "transcribe", "nospeech", "notimestamps", "0.00"])
def test_a_language_whisper_lacks_is_refused(language: str) -> None:
    # Special tokens are spelt as languages are: "<|transcribe|>" is one.
    with pytest.raises(ValueError, match=f"no language '{language}'"):
        WhisperTokens(_vocabulary("base"), language)


def test_a_vocabulary_that_is_not_whispers_is_refused() -> None:
    plain = tokenizers.Tokenizer(tokenizers.models.WordLevel({"hello": 0}, unk_token="hello"))
    with pytest.raises(ValueError, match="not a Whisper vocabulary"):
        WhisperTokens(plain)


@pytest.mark.models
def test_the_default_stt_loads_without_ctranslate2_or_faster_whisper() -> None:
    # Both halves on ONNX Runtime: faster-whisper would bring CTranslate2,
    # PyAV's codec libraries and the hub client into the models' process.
    code = (
        "from voice_agent.backends import registry\n"
        "from voice_agent.config.settings import load_settings\n"
        "settings = load_settings({})\n"
        "stt = registry.create('stt', settings.stt, settings)\n"
    )
    heavy = ("faster_whisper", "ctranslate2", "av", "huggingface_hub")
    assert left_imported(code, heavy) == []
