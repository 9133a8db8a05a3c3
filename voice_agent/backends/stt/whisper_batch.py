"""The batch step of faster-whisper STT: a batch of utterances encoded in
one pass and decoded into transcripts with their evidence, on ONNX Runtime
(the default: whisper_onnx_encoder.py, whisper_onnx_decoder.py) or
CTranslate2. It runs in the batching worker's thread;
the backend (whisper.py) owns the models, the workers and the lanes.

Whisper's encoder is trained on 30 s windows, and faster-whisper pads every
input to 30 s: for a 3 s utterance that is 90 % padding and ~1 s of encoder
time on 2 CPU cores. With ``window="trim"`` (the default) the encoder sees
the utterance plus one second of padding instead, about 4x faster.
``window="full"`` keeps the standard 30 s window.

The padding is what Whisper saw in training: the log-mel of digital silence
at the clip's own level, never zeros (zeros are a steady hum to the model,
which then repeats the utterance into it, stops after one word or calls the
whole clip silence). Each transcript carries its evidence (no-speech
probability, mean log-probability, whether the length limit stopped it), and
``careful=True`` decodes one utterance in the full window: the safe way, for
a fast transcript the session's checks distrust.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import numpy as np
import tokenizers

from voice_agent.audio.log_mel import LogMel
from voice_agent.audio.pcm import int16_to_float
from voice_agent.backends.capabilities import (
    LOGPROB_THRESHOLD,
    NO_SPEECH_THRESHOLD,
    Transcription,
)
from voice_agent.backends.stt.whisper_drafts import RecentTranscripts
from voice_agent.backends.stt.whisper_long import long_pieces
from voice_agent.backends.stt.whisper_onnx_decoder import Decoded, OnnxWhisperDecoder, TokenIds
from voice_agent.backends.stt.whisper_onnx_encoder import OnnxWhisperEncoder
from voice_agent.backends.stt.whisper_tokens import WhisperTokens
from voice_agent.backends.stt.whisper_weights import WeightsUnavailable

if TYPE_CHECKING:  # imported where a half runs on CTranslate2 (whisper_tokens.py: why)
    import ctranslate2
    from faster_whisper import WhisperModel

FULL_WINDOW_FRAMES = 3000  # 30 s of 10 ms mel frames
TRIM_PAD_FRAMES = 100  # 1 s of padding after the utterance
MAX_EXTRA_PAD = 50  # batched utterances differ in length by at most 0.5 s
# Above this no-speech probability, the text is not read at all.
NO_SPEECH_CERTAIN = 0.8
# Whisper decodes at most half its 448-token context after the prompt.
MAX_DECODED_TOKENS = 224
# Fast speech is ~4 words (~6 tokens) a second, plus two timestamps per
# segment; capping the output by the audio's duration stops a repetition
# loop early, and a transcript the cap stopped is marked truncated.
DECODED_TOKENS_PER_SECOND = 8
DECODED_TOKENS_BASE = 8
# The normalised log-mel of digital silence: Whisper floors the power at
# 1e-10 (log -10) and clips log-mel at 8 below the maximum, then maps
# x -> (x + 4) / 4. So silence is the clip's maximum less 2.0, or -1.5 where
# the clip is that quiet itself.
SILENCE_BELOW_MAX = 2.0
SILENCE_FLOOR = -1.5


def _bare(word: str) -> str:
    return re.sub(r"[^a-z']", "", word.lower())


def without_restart(text: str, opening_words: int = 4) -> str:
    """The text up to where it starts over. Whisper sometimes reads the
    audio again from the top into the padding, timestamps and all inside the
    audio (seen on Opus-coded speech: a whole sentence, then its first half
    again). A restart is the utterance's first four words again, right after
    a sentence ends."""
    words = text.split()
    opening = [_bare(w) for w in words[:opening_words]]
    if len(opening) < opening_words:
        return text
    for k in range(opening_words, len(words) - opening_words + 1):
        ended = words[k - 1][-1:] in (".", "?", "!")
        if ended and [_bare(w) for w in words[k : k + opening_words]] == opening:
            return " ".join(words[:k])
    return text


@dataclass
class Utterance:
    """One request's audio, and whether its caller still waits for it: a
    speculation dropped because the user spoke on is cancelled while the
    model may already be encoding it, and its decoding (most of the work)
    is then skipped rather than delaying the next request."""

    audio: np.ndarray
    careful: bool = False  # the full 30 s window
    live: bool = False  # a live partial: optional, the caller still speaking
    abandoned: bool = False  # set on the event loop, read in the worker thread


def _tokenizer_file(path: Path) -> tokenizers.Tokenizer:
    """The model's own tokenizer.json (CTranslate2's converter copies it with
    ``--copy_files tokenizer.json``); faster-whisper would fetch one from
    the Hugging Face hub, which a server here cannot reach."""
    found = path / "tokenizer.json"
    if not found.is_file():
        raise WeightsUnavailable(
            f"{path} has no tokenizer.json: convert the model with --copy_files "
            "tokenizer.json, or run it with --stt-encoder ctranslate2"
        )
    return tokenizers.Tokenizer.from_file(str(found))


class BatchTranscriber:
    """Transcribes batches of utterances with one tokenizer and prompt: on
    ONNX Runtime's encoder and decoder where given (``encoder``,
    ``decoder="onnx"``), else on the CTranslate2 ``model``; partials of the
    idle lane on its own CTranslate2 copy, passed with each batch."""

    def __init__(
        self,
        model: WhisperModel | None,
        path: Path,
        language: str,
        window: Literal["trim", "full"],
        threads: int,
        parallel: int,
        decoder: Literal["onnx", "ctranslate2"],
        encoder: OnnxWhisperEncoder | None = None,
    ) -> None:
        if model is None and (encoder is None or decoder != "onnx"):
            raise ValueError("without a CTranslate2 model, both halves must run on ONNX Runtime")
        self._model = model
        self._encoder = encoder
        # A turn's earlier transcripts, drafts for its later ones.
        self.recent = RecentTranscripts()
        self.abandoned_after_encoding = 0
        self.abandoned_while_decoding = 0
        self._language = language
        self._window = window
        vocabulary = model.hf_tokenizer if model is not None else _tokenizer_file(path)
        self._tokenizer = WhisperTokens(vocabulary, self._language)
        if encoder is not None:
            self._features = LogMel(encoder.mel_bins)
        else:
            assert model is not None
            self._features = LogMel(model.model.n_mels)
        # Timestamps on: in a trimmed window Whisper otherwise tends to "read"
        # the utterance again into the padding; its segment timestamps let us
        # drop anything that starts after the audio ends.
        self._prompt = list(self._tokenizer.sot_sequence)
        # Finals and speculations decode on ONNX Runtime (much faster a
        # token); partials on the idle lane keep CTranslate2's decoder, whose
        # threads are all the copy's idle-priority threads (ONNX Runtime would
        # do part of each step in the calling thread, at normal priority).
        self._onnx: OnnxWhisperDecoder | None = None
        if decoder == "onnx":
            self._onnx = self._onnx_decoder(path, threads, parallel)

    def _onnx_decoder(self, path: Path, threads: int, copies: int) -> OnnxWhisperDecoder:
        settings = json.loads((path / "config.json").read_text())
        tokenizer = self._tokenizer
        ids = TokenIds(
            eot=tokenizer.eot,
            no_timestamps=tokenizer.no_timestamps,
            timestamp_begin=tokenizer.timestamp_begin,
            no_speech=tokenizer.no_speech,
        )
        return OnnxWhisperDecoder(
            path,
            threads,
            ids,
            suppress_ids=settings.get("suppress_ids", []),
            suppress_ids_begin=settings.get("suppress_ids_begin", []),
            copies=copies,
        )

    def _window_frames(self, frames: int, careful: bool = False) -> int:
        if self._window == "full" or careful:
            return FULL_WINDOW_FRAMES
        window = min(FULL_WINDOW_FRAMES, frames + TRIM_PAD_FRAMES)
        return window + window % 2  # the encoder's stride-2 convolution wants an even length

    def transcribe_batch(
        self, batch: list[Utterance], lane: WhisperModel | None = None
    ) -> list[Transcription]:
        """Runs in the worker's thread: the utterances of a batch share one
        encoder and decoder pass, each padded to the batch's longest window.
        ``lane``: the idle lane's CTranslate2 copy; None, the main models."""
        results = [Transcription("")] * len(batch)
        short: list[tuple[int, np.ndarray]] = []
        for i, utterance in enumerate(batch):
            if utterance.abandoned:
                continue
            samples = int16_to_float(utterance.audio)
            features = self._features(samples)
            if features.shape[1] > FULL_WINDOW_FRAMES:
                results[i] = self._transcribe_long(samples, lane, utterance)
            else:
                short.append((i, features))
        for group in self._similar_lengths(short, batch):
            for i, result in self._generate(group, lane, batch):
                results[i] = result
        return results

    def _similar_lengths(
        self, items: list[tuple[int, np.ndarray]], batch: list[Utterance]
    ) -> list[list[tuple[int, np.ndarray]]]:
        """Utterances whose windows differ by at most MAX_EXTRA_PAD: a
        short utterance padded far past its end makes Whisper read it again
        into the silence (seen: a whole sentence repeated)."""

        def window(item: tuple[int, np.ndarray]) -> int:
            return self._window_frames(item[1].shape[1], batch[item[0]].careful)

        groups: list[list[tuple[int, np.ndarray]]] = []
        for item in sorted(items, key=window):
            if groups and window(item) - window(groups[-1][0]) <= MAX_EXTRA_PAD:
                groups[-1].append(item)
            else:
                groups.append([item])
        return groups

    def _generate(
        self,
        group: list[tuple[int, np.ndarray]],
        lane: WhisperModel | None,
        batch: list[Utterance],
        drafts: bool = True,
    ) -> list[tuple[int, Transcription]]:
        """``drafts``: the utterances' audio is what the group encodes (a
        piece of a long one is not), so their tokens may draft and be drafted."""
        window = max(self._window_frames(f.shape[1], batch[i].careful) for i, f in group)
        padded = np.empty((len(group), group[0][1].shape[0], window), dtype=np.float32)
        for row, (_, features) in enumerate(group):
            padded[row] = max(float(features.max()) - SILENCE_BELOW_MAX, SILENCE_FLOOR)
            padded[row, :, : features.shape[1]] = features[:, :window]
        longest = max(f.shape[1] for _, f in group)
        decoded_limit = min(
            MAX_DECODED_TOKENS,
            DECODED_TOKENS_BASE + int(longest / 100 * DECODED_TOKENS_PER_SECOND),
        )
        # Both decoders take CTranslate2's max_length, of which they decode half.
        max_length = 2 * decoded_limit
        onnx_decoder = self._onnx if lane is None else None
        ct2 = lane or self._model
        encoded: np.ndarray | ctranslate2.StorageView
        if lane is None and self._encoder is not None:
            encoded = self._encoder.encode(padded)
        else:
            assert ct2 is not None
            import ctranslate2  # loaded already: a half runs on it

            encoded = ct2.model.encode(
                ctranslate2.StorageView.from_array(padded), to_cpu=onnx_decoder is not None
            )

        def nobody_waits() -> bool:
            return all(batch[i].abandoned for i, _ in group)

        if nobody_waits():
            self.abandoned_after_encoding += 1
            return []  # nobody waits for these any more
        results: list[Decoded]
        if onnx_decoder is not None:
            audio = batch[group[0][0]].audio
            decoded = onnx_decoder.generate(
                np.asarray(encoded),
                self._prompt,
                max_length,
                stop=nobody_waits,
                draft=self.recent.draft_for(audio) if drafts and len(group) == 1 else (),
                # A speculation dropped as the caller spoke on: what it had
                # decoded is the next one's draft all the same.
                stopped=lambda sequences: self._remember(group, batch, sequences, drafts),
            )
            if decoded is None:
                self.abandoned_while_decoding += 1
                return []
            results = decoded
            # Not a loop the length limit cut.
            finished = [r.tokens if r.finished else [] for r in results]
            self._remember(group, batch, finished, drafts)
        else:
            assert ct2 is not None
            import ctranslate2

            if isinstance(encoded, np.ndarray):
                encoded = ctranslate2.StorageView.from_array(encoded)
            generated = ct2.model.generate(
                encoded,
                [self._prompt] * len(group),
                beam_size=1,
                max_length=max_length,
                return_no_speech_prob=True,
                return_scores=True,
                suppress_blank=True,
                suppress_tokens=[-1],
            )
            results = [
                Decoded(
                    r.sequences_ids[0],
                    r.no_speech_prob,
                    # Scores are normalised by length; Whisper's mean counts
                    # the end of text too.
                    avg_logprob=r.scores[0]
                    * len(r.sequences_ids[0])
                    / (len(r.sequences_ids[0]) + 1),
                    finished=len(r.sequences_ids[0]) < decoded_limit,
                )
                for r in generated
            ]
        transcriptions: list[tuple[int, Transcription]] = []
        for (i, features), result in zip(group, results, strict=True):
            # Whisper's silence rule (a probable no-speech and an improbable
            # text), or a no-speech so probable that the text can only be
            # invented ("you" on silence). The probability alone at Whisper's
            # threshold also rejected clear speech.
            silent = result.no_speech_prob > NO_SPEECH_CERTAIN or (
                result.no_speech_prob > NO_SPEECH_THRESHOLD
                and result.avg_logprob < LOGPROB_THRESHOLD
            )
            # Noise or breath: Whisper would otherwise invent a phrase.
            text, stops_inside = "", False
            if not silent:
                text, stops_inside = self._decode_segments(result.tokens, features.shape[1] / 100)
            transcriptions.append(
                (
                    i,
                    Transcription(
                        text,
                        no_speech_prob=result.no_speech_prob,
                        avg_logprob=result.avg_logprob,
                        truncated=stops_inside and not result.finished,
                        careful=window == FULL_WINDOW_FRAMES,
                    ),
                )
            )
        return transcriptions

    def _remember(
        self,
        group: list[tuple[int, np.ndarray]],
        batch: list[Utterance],
        tokens: list[list[int]],
        drafts: bool,
    ) -> None:
        """Each utterance's tokens, a draft for the same turn's next."""
        if not drafts:
            return
        for (i, _), row in zip(group, tokens, strict=True):
            self.recent.remember(batch[i].audio, row)

    def _decode_segments(self, tokens: list[int], duration_s: float) -> tuple[str, bool]:
        """Text of the timestamped segments that start inside the audio, and
        whether the tokens stop inside the audio too (if the length limit
        stopped them, the rest of the utterance is missing)."""
        first_timestamp = self._tokenizer.timestamp_begin
        texts: list[str] = []
        words: list[int] = []
        start: float | None = None
        last_time = 0.0
        for token in tokens:
            if token >= first_timestamp:
                last_time = (token - first_timestamp) * 0.02
                if start is None:
                    start = last_time
                    continue
                if start < duration_s - 0.1:
                    texts.append(self._tokenizer.decode(words))
                words, start = [], None
            elif token < self._tokenizer.eot:
                words.append(token)
        if words and (start is None or start < duration_s - 0.1):
            texts.append(self._tokenizer.decode(words))
        text = "".join(texts).strip()
        kept = without_restart(text)
        # A restart cut away means the words that matter all came before it.
        return kept, last_time < duration_s - 0.1 and kept == text

    def _transcribe_long(
        self, samples: np.ndarray, lane: WhisperModel | None, utterance: Utterance
    ) -> Transcription:
        model = lane or self._model
        if model is None:  # ONNX Runtime only: piece by piece in the trimmed window
            texts, truncated = [], False
            for piece in long_pieces(samples):
                if utterance.abandoned:
                    break  # nobody waits for the rest
                group = [(0, self._features(piece))]
                for _, result in self._generate(group, None, [utterance], drafts=False):
                    texts.append(result.text)
                    truncated = truncated or result.truncated
            text = " ".join(text for text in texts if text)
            return Transcription(text, truncated=truncated, careful=True)
        segments, _info = model.transcribe(
            samples,
            language=self._language,
            beam_size=1,
            condition_on_previous_text=False,
            without_timestamps=True,
            vad_filter=False,
        )
        text = " ".join(segment.text.strip() for segment in segments).strip()
        return Transcription(text, careful=True)
