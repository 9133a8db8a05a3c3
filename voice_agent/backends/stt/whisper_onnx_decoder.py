"""Whisper's decoder on ONNX Runtime with 8-bit weights (``--stt-decoder onnx``).

Why: on a small CPU the decoder, not the encoder, is most of a transcript.
CTranslate2 takes about 10 ms a token for Whisper base's decoder on 2 cores
(and a second thread buys nothing), most of it in an int8 GEMM kernel that
is slow for a single row; a 7 s turn's 29 tokens cost ~290 ms after an 80 ms
encoder. ONNX Runtime's ``MatMulNBits`` with 8-bit weights and int8 compute
(``accuracy_level`` 4) runs the same decoder step in about 3.5 ms.

The graphs are built from the float16 weights inside the packaged
CTranslate2 model (whisper_onnx_graphs.py; whisper_graph_cache.py keeps
them on disk once built): no second copy of the model ships. It takes the
encoder's output (whisper_onnx_encoder.py's, or CTranslate2's with
``--stt-encoder ctranslate2``). The decoding reproduces
CTranslate2's greedy search exactly (its suppressed tokens, blank
suppression, timestamp rules, no-speech probability and length limit), so
the transcript is the same wherever the two runtimes' int8 arithmetic
agrees on the best token.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime

from voice_agent.backends.runtime.onnx_options import quiet_session_options, session_from_bytes
from voice_agent.backends.stt.whisper_graph_cache import decoder_graphs

log = logging.getLogger(__name__)

MAX_INITIAL_TIMESTAMP_INDEX = 50  # CTranslate2's default (1 s)


@dataclass(frozen=True)
class TokenIds:
    """The special tokens decoding needs, from the model's tokenizer."""

    eot: int
    no_timestamps: int
    timestamp_begin: int
    no_speech: int


@dataclass
class Decoded:
    tokens: list[int]
    no_speech_prob: float
    # The chosen tokens' mean log-probability, end of text included (as
    # Whisper computes it), after the logits processors.
    avg_logprob: float = 0.0
    finished: bool = True  # False: the length limit stopped it, not end of text


def _session(serialized: bytes, threads: int) -> onnxruntime.InferenceSession:
    # Not spinning: measured, the LLM's first token came 15 ms later after a
    # transcript with spinning threads, and a step is no slower without
    # (0870: 175-187 ms of decoding either way). Every step is a new input
    # shape (the cache grows by one position).
    options = quiet_session_options(threads)
    # Nor keep an arena the size of the largest batch ever decoded (its
    # cross-attention keys and values alone are 13 MB a caller for 10 s of
    # audio): 60 batches of up to 3 utterances of 0.5-18 s grew the process
    # by 165 MB without it, 255 MB with it, at the same speed.
    options.enable_cpu_mem_arena = False
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    return session_from_bytes(serialized, options)


@dataclass(frozen=True)
class _Sessions:
    step: onnxruntime.InferenceSession
    cross: onnxruntime.InferenceSession


class OnnxWhisperDecoder:
    """Greedy decoding of Whisper transcripts from CTranslate2 encoder output.

    ``copies`` session pairs, one per batch the STT runs at once (as
    CTranslate2 keeps one replica per worker): a transcript holds one pair
    for its whole decoding, so concurrent batches never share a thread pool.
    """

    def __init__(
        self,
        model_dir: Path,
        threads: int,
        ids: TokenIds,
        suppress_ids: Sequence[int],
        suppress_ids_begin: Sequence[int],
        copies: int = 1,
    ) -> None:
        started = time.monotonic()
        step_bytes, cross_bytes = decoder_graphs(model_dir / "model.bin")
        self._sessions: queue.SimpleQueue[_Sessions] = queue.SimpleQueue()
        for _ in range(copies):
            self._sessions.put(
                _Sessions(_session(step_bytes, threads), _session(cross_bytes, threads))
            )
        first = self._sessions.get()
        self._step_outputs = [o.name for o in first.step.get_outputs()]
        self._cross_outputs = [o.name for o in first.cross.get_outputs()]
        # The model's sizes, as the graph's fixed dimensions hold them.
        shapes = {i.name: i.shape for i in first.step.get_inputs()}
        self._layers = sum(name.startswith("past_key_") for name in shapes)
        _, heads, _, head_dim = shapes["past_key_0"]
        self._heads, self._head_dim = int(heads), int(head_dim)
        self._vocabulary = int(first.step.get_outputs()[0].shape[2])  # logits [B, S, V]
        self._sessions.put(first)
        self._ids = ids
        self._suppress = np.asarray(sorted(set(suppress_ids)), dtype=np.int64)
        self._suppress_begin = np.asarray(sorted(set(suppress_ids_begin)), dtype=np.int64)
        self._timestamp_end = self._vocabulary - 1
        log.info(
            "onnx whisper decoder built",
            extra={
                "layers": self._layers,
                "copies": copies,
                "seconds": round(time.monotonic() - started, 2),
            },
        )

    def generate(
        self,
        encoded: np.ndarray,
        prompt: Sequence[int],
        max_length: int,
        stop: Callable[[], bool] = lambda: False,
        draft: Sequence[int] = (),
        stopped: Callable[[list[list[int]]], None] = lambda sequences: None,
    ) -> list[Decoded] | None:
        """CTranslate2's ``generate(beam_size=1, return_no_speech_prob=True,
        suppress_blank=True, suppress_tokens=[-1])`` with timestamps, for a
        prompt of start-of-transcript, language and task. None when ``stop``
        says nobody waits any more (checked between steps); ``stopped`` is
        then told each row's tokens decoded so far.

        ``draft`` (one utterance only): tokens the transcript probably starts
        with, such as the transcript of this turn's audio at an earlier
        pause. They are fed with the prompt in one step, and each is kept
        only while it is the token greedy decoding chooses there; from the
        first that is not, decoding goes on token by token as without one.
        So the transcript is the one decoded without a draft (up to the
        rounding of one step over many positions against many steps of
        one), and each kept token costs a few ms less (a 7 s turn: 33
        positions in one step 42 ms, against 30 steps 210 ms)."""
        if not prompt or self._ids.no_timestamps in prompt:
            raise ValueError(
                "the prompt must be start-of-transcript and task tokens, with timestamps"
            )
        sessions = self._sessions.get()
        try:
            return self._generate(sessions, encoded, prompt, max_length, stop, draft, stopped)
        finally:
            self._sessions.put(sessions)

    def _generate(
        self,
        sessions: _Sessions,
        encoded: np.ndarray,
        prompt: Sequence[int],
        max_length: int,
        stop: Callable[[], bool],
        draft: Sequence[int],
        stopped: Callable[[list[list[int]]], None],
    ) -> list[Decoded] | None:
        batch = encoded.shape[0]
        cross = sessions.cross.run(
            self._cross_outputs, {"encoded": np.ascontiguousarray(encoded, np.float32)}
        )
        feeds: dict[str, np.ndarray] = dict(zip(self._cross_outputs, cross, strict=True))
        empty = np.zeros((batch, self._heads, 0, self._head_dim), dtype=np.float32)
        for i in range(self._layers):
            feeds[f"past_key_{i}"] = empty
            feeds[f"past_value_{i}"] = empty
        count = len(prompt)
        # CTranslate2 decodes at most this many tokens after its prompt.
        limit = min(max_length // 2, max_length - (count - 1))
        # Drafted tokens whose logits the first step computed, still to be
        # checked against greedy decoding's choice, in order.
        pending = list(draft)[: limit - 1] if batch == 1 else []
        tokens = np.tile(np.asarray([*prompt, *pending], np.int64), (batch, 1))
        logits = self._run(sessions.step, feeds, tokens, 0)
        # The no-speech probability is read where the start of transcript
        # was fed: the prompt's first position.
        no_speech = _softmax(logits[:, 0])[:, self._ids.no_speech]
        sequences: list[list[int]] = [[] for _ in range(batch)]
        logprobs = [0.0] * batch
        done = [False] * batch
        last = logits[:, count - 1]
        for step in range(limit):
            if stop():
                stopped(sequences)
                return None
            chosen = self._choose(last, sequences, done, step, logprobs)
            for row, token in enumerate(chosen):
                if done[row]:
                    continue
                if token == self._ids.eot:
                    done[row] = True
                else:
                    sequences[row].append(token)
            if all(done) or step == limit - 1:
                break
            if pending and chosen[0] == pending[0]:  # the draft's token: computed already
                pending.pop(0)
                last = logits[:, count + step]
                continue
            if pending:  # the draft went another way here: its later positions go
                self._keep_positions(feeds, count + step)
                pending = []
            tokens = np.asarray(chosen, dtype=np.int64).reshape(batch, 1)
            last = self._run(sessions.step, feeds, tokens, count + step)[:, -1]
        return [
            Decoded(
                tokens=seq,
                no_speech_prob=float(p),
                avg_logprob=total / (len(seq) + 1),
                finished=finished,
            )
            for seq, p, total, finished in zip(sequences, no_speech, logprobs, done, strict=True)
        ]

    def _run(
        self,
        step: onnxruntime.InferenceSession,
        feeds: dict[str, np.ndarray],
        tokens: np.ndarray,
        past: int,
    ) -> np.ndarray:
        """Logits [B, S, V] for ``tokens`` at positions past..past+S-1; the
        cache in ``feeds`` is advanced to include them."""
        length = tokens.shape[1]
        bias = np.zeros((length, past + length), dtype=np.float32)
        bias[:, past:] = np.triu(np.full((length, length), -np.inf, dtype=np.float32), k=1)
        feeds["tokens"] = tokens
        feeds["positions"] = np.arange(past, past + length, dtype=np.int64)
        feeds["bias"] = bias
        results = dict(zip(self._step_outputs, step.run(self._step_outputs, feeds), strict=True))
        for i in range(self._layers):
            feeds[f"past_key_{i}"] = results[f"present_key_{i}"]
            feeds[f"past_value_{i}"] = results[f"present_value_{i}"]
        logits: np.ndarray = results["logits"]
        return logits

    def _keep_positions(self, feeds: dict[str, np.ndarray], positions: int) -> None:
        """The cache in ``feeds`` cut back to its first ``positions``."""
        for i in range(self._layers):
            for name in (f"past_key_{i}", f"past_value_{i}"):
                feeds[name] = np.ascontiguousarray(feeds[name][:, :, :positions])

    def _choose(
        self,
        logits: np.ndarray,
        sequences: list[list[int]],
        done: list[bool],
        step: int,
        logprobs: list[float],
    ) -> list[int]:
        """The greedy choice per row after CTranslate2's logits processors,
        in its order: suppressed tokens, blank suppression at the first
        step, then Whisper's timestamp rules. Adds each choice's
        log-probability to ``logprobs``."""
        ids = self._ids
        scores = logits.astype(np.float32, copy=True)
        scores[:, self._suppress] = -np.inf
        if step == 0:
            scores[:, self._suppress_begin] = -np.inf
        begin, end = ids.timestamp_begin, self._timestamp_end
        chosen = []
        for row in range(scores.shape[0]):
            seq = sequences[row]
            if done[row]:  # its choice is ignored
                chosen.append(ids.eot)
                continue
            s = scores[row]
            s[ids.no_timestamps] = -np.inf
            check_probability = False
            if step == 0:
                s[:begin] = -np.inf
                s[begin + MAX_INITIAL_TIMESTAMP_INDEX + 1 : end + 1] = -np.inf
            else:
                last_token = seq[step - 1]
                if last_token >= begin:
                    penultimate = seq[step - 2] if step - 1 > 0 else last_token
                    if penultimate >= begin:
                        s[begin : end + 1] = -np.inf
                    else:
                        s[: ids.eot] = -np.inf
                        check_probability = True
                else:
                    check_probability = True
                for token in reversed(seq[:step]):
                    if token >= begin:
                        s[begin:token] = -np.inf
                        break
            if check_probability:
                log_probs = _log_softmax(s)
                text_best = log_probs[:begin].max()
                timestamp_mass = _logsumexp(log_probs[begin : end + 1])
                if timestamp_mass > text_best:
                    s[:begin] = -np.inf
            token = int(np.argmax(s))
            logprobs[row] += float(_log_softmax(s)[token])
            chosen.append(token)
        return chosen


def _log_softmax(x: np.ndarray) -> np.ndarray:
    top = x.max()
    shifted = x - top
    result: np.ndarray = shifted - np.log(np.exp(shifted).sum())
    return result


def _logsumexp(x: np.ndarray) -> float:
    top = x.max()
    if not np.isfinite(top):
        return float(top)
    return float(top + np.log(np.exp(x - top).sum()))


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    result: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return result
