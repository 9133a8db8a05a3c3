"""Whisper's decoder on ONNX Runtime with 8-bit weights (``--stt-decoder onnx``).

Why: on a small CPU the decoder, not the encoder, is most of a transcript.
CTranslate2 takes about 10 ms a token for Whisper base's decoder on 2 cores
(and a second thread buys nothing), most of it in an int8 GEMM kernel that
is slow for a single row; a 7 s turn's 29 tokens cost ~290 ms after an 80 ms
encoder. ONNX Runtime's ``MatMulNBits`` with 8-bit weights and int8 compute
(``accuracy_level`` 4) runs the same decoder step in about 3.5 ms.

The graph is built here, at start-up, from the float16 weights inside the
packaged CTranslate2 model (ct2_model_file.py): no second copy of the model
ships. CTranslate2 still runs the encoder (fast there); this takes its
output. The decoding reproduces CTranslate2's greedy search exactly (its
suppressed tokens, blank suppression, timestamp rules, no-speech
probability and length limit), so the transcript is the same wherever the
two runtimes' int8 arithmetic agrees on the best token.

One step graph serves the prompt (several positions at once, causally
masked) and every token after it (one position, the cache of the steps
before passed back in). A second small graph turns the encoder's output
into each layer's cross-attention keys and values, once per transcript.
"""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper, numpy_helper

from voice_agent.backends.ct2_model_file import read_variables
from voice_agent.backends.onnx_options import quiet_session_options

log = logging.getLogger(__name__)

BLOCK = 32  # weights quantised in blocks of 32 along the input dimension
BITS = 8
ZERO_POINT = 1 << (BITS - 1)  # MatMulNBits' default for an 8-bit weight
INT8_COMPUTE = 4  # MatMulNBits accuracy_level: int8 activations (fast kernels)
MAX_INITIAL_TIMESTAMP_INDEX = 50  # CTranslate2's default (1 s)
LAYER_NORM_EPSILON = 1e-5


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


class _GraphBuilder:
    """Nodes and initialisers of one graph, named as they are added."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        self.weights = weights
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def _name(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def constant(self, stem: str, value: np.ndarray) -> str:
        name = self._name(stem)
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: Sequence[str], output: str | None = None, **attrs: Any) -> str:
        out = output or self._name(op)
        domain = "com.microsoft" if op in ("MatMulNBits", "Gelu") else ""
        self.nodes.append(helper.make_node(op, list(inputs), [out], domain=domain, **attrs))
        return out

    def float_weight(self, name: str) -> np.ndarray:
        return np.asarray(self.weights[name], dtype=np.float32)

    def linear(self, x: str, weight: np.ndarray, bias: np.ndarray | None) -> str:
        """``x @ weight.T (+ bias)`` with ``weight`` [out, in] as 8-bit blocks."""
        packed, scales = quantize_blocks(weight)
        y = self.quantized_linear(
            x, self.constant("w", packed), self.constant("scale", scales), weight.shape
        )
        return y if bias is None else self.node("Add", [y, self.constant("b", bias)])

    def quantized_linear(
        self, x: str, packed: str, scales: str, shape: tuple[int, ...], output: str | None = None
    ) -> str:
        n, k = shape
        return self.node(
            "MatMulNBits",
            [x, packed, scales],
            output,
            K=k,
            N=n,
            bits=BITS,
            block_size=BLOCK,
            accuracy_level=INT8_COMPUTE,
        )

    def dense(self, x: str, prefix: str, rows: slice = slice(None)) -> str:
        weight = self.float_weight(prefix + "/weight")[rows]
        bias_name = prefix + "/bias"
        bias = self.float_weight(bias_name)[rows] if bias_name in self.weights else None
        return self.linear(x, weight, bias)

    def layer_norm(self, x: str, prefix: str) -> str:
        gamma = self.constant("gamma", self.float_weight(prefix + "/gamma"))
        beta = self.constant("beta", self.float_weight(prefix + "/beta"))
        return self.node(
            "LayerNormalization", [x, gamma, beta], axis=-1, epsilon=LAYER_NORM_EPSILON
        )

    def split_heads(self, x: str, heads: int, head_dim: int) -> str:
        """[B, S, heads * head_dim] -> [B, heads, S, head_dim]."""
        shape = self.constant("shape", np.array([0, -1, heads, head_dim], dtype=np.int64))
        return self.node("Transpose", [self.node("Reshape", [x, shape])], perm=[0, 2, 1, 3])

    def merge_heads(self, x: str, width: int) -> str:
        shape = self.constant("shape", np.array([0, -1, width], dtype=np.int64))
        return self.node("Reshape", [self.node("Transpose", [x], perm=[0, 2, 1, 3]), shape])

    def attend(self, q: str, k: str, v: str, head_dim: int, bias: str | None) -> str:
        scores = self.node("MatMul", [q, self.node("Transpose", [k], perm=[0, 1, 3, 2])])
        scale = self.constant("scale", np.array(head_dim**-0.5, dtype=np.float32))
        scores = self.node("Mul", [scores, scale])
        if bias is not None:
            scores = self.node("Add", [scores, bias])
        return self.node("MatMul", [self.node("Softmax", [scores], axis=-1), v])

    def model(
        self, name: str, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, name, inputs, outputs, self.initializers)
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        return helper.make_model(graph, opset_imports=opsets)


def quantize_blocks(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits' 8-bit layout of a [N, K] weight: symmetric blocks of
    BLOCK along K, stored offset by the default zero point."""
    n, k = weight.shape
    if k % BLOCK:
        raise ValueError(f"input width {k} is not a multiple of {BLOCK}")
    blocks = weight.reshape(n, k // BLOCK, BLOCK).astype(np.float32)
    scales = np.abs(blocks).max(axis=2) / 127.0
    scales[scales == 0] = 1.0
    q = np.clip(np.rint(blocks / scales[:, :, None]), -127, 127)
    packed = (q + ZERO_POINT).astype(np.uint8)
    return packed, scales.reshape(-1).astype(np.float32)


def _tensor(name: str, elem: int, shape: Sequence[str | int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def _layers(weights: dict[str, np.ndarray]) -> int:
    count = 0
    while f"decoder/layer_{count}/ffn/layer_norm/gamma" in weights:
        count += 1
    return count


def build_step_graph(weights: dict[str, np.ndarray], heads: int) -> onnx.ModelProto:
    """tokens [B, S], positions [S], bias [S, P + S], each layer's past self
    keys/values [B, H, P, Dh] and cross keys/values [B, H, T, Dh] ->
    logits [B, S, V] and each layer's present keys/values [B, H, P + S, Dh]."""
    g = _GraphBuilder(weights)
    embeddings = g.float_weight("decoder/embeddings/weight")
    vocabulary, width = embeddings.shape
    head_dim = width // heads
    inputs = [
        _tensor("tokens", TensorProto.INT64, ["B", "S"]),
        _tensor("positions", TensorProto.INT64, ["S"]),
        _tensor("bias", TensorProto.FLOAT, ["S", "PS"]),
    ]
    outputs = [_tensor("logits", TensorProto.FLOAT, ["B", "S", vocabulary])]
    # The embeddings are also the output layer (tied): one 8-bit copy
    # serves both, a row gathered and scaled back for each token.
    packed, scales = quantize_blocks(embeddings)
    packed_name = g.constant("embeddings", packed)
    scales_flat = g.constant("embedding_scales", scales)
    row_scales = g.node(
        "Reshape", [scales_flat, g.constant("shape", np.array([vocabulary, -1, 1], dtype=np.int64))]
    )
    rows = g.node("Cast", [g.node("Gather", [packed_name, "tokens"])], to=TensorProto.FLOAT)
    centred = g.node("Sub", [rows, g.constant("zero", np.array(ZERO_POINT, dtype=np.float32))])
    scaled = g.node("Mul", [centred, g.node("Gather", [row_scales, "tokens"])])
    token_embedding = g.node(
        "Reshape", [scaled, g.constant("shape", np.array([0, 0, width], dtype=np.int64))]
    )
    position_table = g.constant("positions", g.float_weight("decoder/position_encodings/encodings"))
    x = g.node("Add", [token_embedding, g.node("Gather", [position_table, "positions"])])
    for i in range(_layers(weights)):
        layer = f"decoder/layer_{i}"
        cache = ["B", heads, "P", head_dim]
        inputs += [
            _tensor(f"past_key_{i}", TensorProto.FLOAT, cache),
            _tensor(f"past_value_{i}", TensorProto.FLOAT, cache),
            _tensor(f"cross_key_{i}", TensorProto.FLOAT, ["B", heads, "T", head_dim]),
            _tensor(f"cross_value_{i}", TensorProto.FLOAT, ["B", heads, "T", head_dim]),
        ]
        present = ["B", heads, "PS", head_dim]
        outputs += [
            _tensor(f"present_key_{i}", TensorProto.FLOAT, present),
            _tensor(f"present_value_{i}", TensorProto.FLOAT, present),
        ]
        # Self-attention (CTranslate2 keeps q, k and v as one fused weight).
        h = g.layer_norm(x, layer + "/self_attention/layer_norm")
        fused = layer + "/self_attention/linear_0"
        q = g.dense(h, fused, slice(0, width))
        k = g.dense(h, fused, slice(width, 2 * width))
        v = g.dense(h, fused, slice(2 * width, 3 * width))
        keys = g.node(
            "Concat",
            [f"past_key_{i}", g.split_heads(k, heads, head_dim)],
            f"present_key_{i}",
            axis=2,
        )
        values = g.node(
            "Concat",
            [f"past_value_{i}", g.split_heads(v, heads, head_dim)],
            f"present_value_{i}",
            axis=2,
        )
        attended = g.attend(g.split_heads(q, heads, head_dim), keys, values, head_dim, "bias")
        x = g.node(
            "Add",
            [x, g.dense(g.merge_heads(attended, width), layer + "/self_attention/linear_1")],
        )
        # Cross-attention over the audio.
        h = g.layer_norm(x, layer + "/attention/layer_norm")
        q = g.split_heads(g.dense(h, layer + "/attention/linear_0"), heads, head_dim)
        attended = g.attend(q, f"cross_key_{i}", f"cross_value_{i}", head_dim, None)
        x = g.node(
            "Add", [x, g.dense(g.merge_heads(attended, width), layer + "/attention/linear_2")]
        )
        h = g.layer_norm(x, layer + "/ffn/layer_norm")
        h = g.node("Gelu", [g.dense(h, layer + "/ffn/linear_0")])
        x = g.node("Add", [x, g.dense(h, layer + "/ffn/linear_1")])
    x = g.layer_norm(x, "decoder/layer_norm")
    g.quantized_linear(x, packed_name, scales_flat, embeddings.shape, "logits")
    return g.model("whisper_decoder_step", inputs, outputs)


def build_cross_graph(weights: dict[str, np.ndarray], heads: int) -> onnx.ModelProto:
    """The encoder's output [B, T, D] -> each layer's cross-attention keys
    and values [B, H, T, Dh] (CTranslate2 fuses them as one weight)."""
    g = _GraphBuilder(weights)
    width = g.float_weight("decoder/layer_norm/gamma").shape[0]
    head_dim = width // heads
    inputs = [_tensor("encoded", TensorProto.FLOAT, ["B", "T", width])]
    outputs = []
    for i in range(_layers(weights)):
        fused = f"decoder/layer_{i}/attention/linear_1"
        for name, rows in (("key", slice(0, width)), ("value", slice(width, 2 * width))):
            projected = g.split_heads(g.dense("encoded", fused, rows), heads, head_dim)
            g.node("Identity", [projected], f"cross_{name}_{i}")
            outputs.append(
                _tensor(f"cross_{name}_{i}", TensorProto.FLOAT, ["B", heads, "T", head_dim])
            )
    return g.model("whisper_cross_attention", inputs, outputs)


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
    return onnxruntime.InferenceSession(serialized, options, providers=["CPUExecutionProvider"])


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
        weights = read_variables(model_dir / "model.bin")
        self._layers = _layers(weights)
        heads = int(weights["decoder/num_heads"].reshape(-1)[0])
        self._heads = heads
        self._head_dim = weights["decoder/layer_norm/gamma"].shape[0] // heads
        self._vocabulary = weights["decoder/embeddings/weight"].shape[0]
        step_graph = build_step_graph(weights, heads)
        cross_graph = build_cross_graph(weights, heads)
        del weights
        self._step_outputs = [o.name for o in step_graph.graph.output]
        self._cross_outputs = [o.name for o in cross_graph.graph.output]
        step_bytes = step_graph.SerializeToString()
        cross_bytes = cross_graph.SerializeToString()
        del step_graph, cross_graph
        self._sessions: queue.SimpleQueue[_Sessions] = queue.SimpleQueue()
        for _ in range(copies):
            self._sessions.put(
                _Sessions(_session(step_bytes, threads), _session(cross_bytes, threads))
            )
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
    ) -> list[Decoded] | None:
        """CTranslate2's ``generate(beam_size=1, return_no_speech_prob=True,
        suppress_blank=True, suppress_tokens=[-1])`` with timestamps, for a
        prompt of start-of-transcript, language and task. None when ``stop``
        says nobody waits any more (checked between steps)."""
        if not prompt or self._ids.no_timestamps in prompt:
            raise ValueError(
                "the prompt must be start-of-transcript and task tokens, with timestamps"
            )
        sessions = self._sessions.get()
        try:
            return self._generate(sessions, encoded, prompt, max_length, stop)
        finally:
            self._sessions.put(sessions)

    def _generate(
        self,
        sessions: _Sessions,
        encoded: np.ndarray,
        prompt: Sequence[int],
        max_length: int,
        stop: Callable[[], bool],
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
        tokens = np.tile(np.asarray(prompt, np.int64), (batch, 1))
        logits = self._run(sessions.step, feeds, tokens, 0)
        # The no-speech probability is read where the start of transcript
        # was fed: the prompt's first position.
        no_speech = _softmax(logits[:, 0])[:, self._ids.no_speech]
        # CTranslate2 decodes at most this many tokens after its prompt.
        limit = min(max_length // 2, max_length - (count - 1))
        sequences: list[list[int]] = [[] for _ in range(batch)]
        logprobs = [0.0] * batch
        done = [False] * batch
        last = logits[:, -1]
        for step in range(limit):
            if stop():
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
