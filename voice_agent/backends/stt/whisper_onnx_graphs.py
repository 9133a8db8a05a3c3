"""Whisper as ONNX graphs with 8-bit weights, built from the float16
weights inside the packaged CTranslate2 model (ct2_model_file.py), and kept
on disk once built.

The encoder graph takes a batch of log-mel windows of any even length (the
trimmed window) and gives the audio's states. Its weights are int8 a column
and its activations quantised on the fly (``DynamicQuantizeMatMul``): a
whole window of frames a product, where that kernel is fastest; all but the
feed-forward's second product, whose weights are 8-bit blocks as the
decoder's are (below).

The decoder's step graph serves the prompt (several positions at once,
causally masked) and every token after it (one position, the cache of the
steps before passed back in); its weights are 8-bit blocks
(``MatMulNBits``), fastest for one row at a time. A second small graph turns
the encoder's output into each layer's cross-attention keys and values, once
per transcript.

Building them (quantising every weight) takes about a second on 2 cores:
whisper_graph_cache.py keeps them on disk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

BLOCK = 32  # weights quantised in blocks of 32 along the input dimension
BITS = 8
ZERO_POINT = 1 << (BITS - 1)  # MatMulNBits' default for an 8-bit weight
INT8_COMPUTE = 4  # MatMulNBits accuracy_level: int8 activations (fast kernels)
LAYER_NORM_EPSILON = 1e-5
MICROSOFT_OPS = ("MatMulNBits", "DynamicQuantizeMatMul", "Gelu")


class _GraphBuilder:
    """Nodes and initialisers of one graph, named as they are added."""

    def __init__(self, weights: dict[str, np.ndarray], per_column: bool = False) -> None:
        self.weights = weights
        self.per_column = per_column  # DynamicQuantizeMatMul, not MatMulNBits blocks
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
        domain = "com.microsoft" if op in MICROSOFT_OPS else ""
        self.nodes.append(helper.make_node(op, list(inputs), [out], domain=domain, **attrs))
        return out

    def float_weight(self, name: str) -> np.ndarray:
        return np.asarray(self.weights[name], dtype=np.float32)

    def linear(
        self, x: str, weight: np.ndarray, bias: np.ndarray | None, blocks: bool = False
    ) -> str:
        """``x @ weight.T (+ bias)`` with ``weight`` [out, in] as 8-bit blocks,
        or int8 columns when ``per_column`` (and not ``blocks``)."""
        if self.per_column and not blocks:
            quantized, column_scales = quantize_columns(weight)
            inputs = [
                x,
                self.constant("w", quantized),
                self.constant("scale", column_scales),
                self.constant("zero", np.zeros(len(column_scales), dtype=np.int8)),
            ]
            if bias is not None:
                inputs.append(self.constant("b", bias))
            return self.node("DynamicQuantizeMatMul", inputs)
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

    def dense(self, x: str, prefix: str, rows: slice = slice(None), blocks: bool = False) -> str:
        """``x`` through the layer at ``prefix``; ``blocks``: as 8-bit blocks
        even in a ``per_column`` graph."""
        weight = self.float_weight(prefix + "/weight")[rows]
        bias_name = prefix + "/bias"
        bias = self.float_weight(bias_name)[rows] if bias_name in self.weights else None
        return self.linear(x, weight, bias, blocks)

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


def quantize_columns(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A [N, K] weight as DynamicQuantizeMatMul's B: [K, N] symmetric int8,
    one scale an output column."""
    columns = np.ascontiguousarray(weight.T, dtype=np.float32)
    scales = np.abs(columns).max(axis=0) / 127.0
    scales[scales == 0] = 1.0
    quantized = np.clip(np.rint(columns / scales), -127, 127).astype(np.int8)
    return quantized, scales.astype(np.float32)


def _tensor(name: str, elem: int, shape: Sequence[str | int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, list(shape))


def layer_count(weights: dict[str, np.ndarray]) -> int:
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
    for i in range(layer_count(weights)):
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
    for i in range(layer_count(weights)):
        fused = f"decoder/layer_{i}/attention/linear_1"
        for name, rows in (("key", slice(0, width)), ("value", slice(width, 2 * width))):
            projected = g.split_heads(g.dense("encoded", fused, rows), heads, head_dim)
            g.node("Identity", [projected], f"cross_{name}_{i}")
            outputs.append(
                _tensor(f"cross_{name}_{i}", TensorProto.FLOAT, ["B", heads, "T", head_dim])
            )
    return g.model("whisper_cross_attention", inputs, outputs)


def build_encoder_graph(weights: dict[str, np.ndarray], heads: int) -> onnx.ModelProto:
    """Log-mel features [B, M, F] (F even, at most the 3000 frames the
    position table covers) -> the audio's states [B, F / 2, D]: two
    convolutions with GELU (the second halves the frame rate), the
    positions, the layers, a last norm."""
    g = _GraphBuilder(weights, per_column=True)
    width, mels, _kernel = weights["encoder/conv1/weight"].shape
    head_dim = width // heads
    inputs = [_tensor("features", TensorProto.FLOAT, ["B", mels, "F"])]
    outputs = [_tensor("encoded", TensorProto.FLOAT, ["B", "T", width])]
    x = "features"
    for conv, stride in (("encoder/conv1", 1), ("encoder/conv2", 2)):
        weight = g.constant("conv", g.float_weight(conv + "/weight"))
        bias = g.constant("conv_bias", g.float_weight(conv + "/bias"))
        x = g.node(
            "Gelu",
            [g.node("Conv", [x, weight, bias], kernel_shape=[3], pads=[1, 1], strides=[stride])],
        )
    x = g.node("Transpose", [x], perm=[0, 2, 1])  # [B, T, D]
    one, two = (g.constant("index", np.array([i], dtype=np.int64)) for i in (1, 2))
    frames = g.node("Slice", [g.node("Shape", [x]), one, two])
    table = g.constant("positions", g.float_weight("encoder/position_encodings/encodings"))
    zero = g.constant("index", np.array([0], dtype=np.int64))
    x = g.node("Add", [x, g.node("Slice", [table, zero, frames, zero])])
    layer = 0
    while f"encoder/layer_{layer}/ffn/layer_norm/gamma" in weights:
        prefix = f"encoder/layer_{layer}"
        h = g.layer_norm(x, prefix + "/self_attention/layer_norm")
        fused = prefix + "/self_attention/linear_0"
        q, k, v = (
            g.split_heads(g.dense(h, fused, slice(i * width, (i + 1) * width)), heads, head_dim)
            for i in range(3)
        )
        attended = g.merge_heads(g.attend(q, k, v, head_dim, None), width)
        x = g.node("Add", [x, g.dense(attended, prefix + "/self_attention/linear_1")])
        h = g.layer_norm(x, prefix + "/ffn/layer_norm")
        h = g.node("Gelu", [g.dense(h, prefix + "/ffn/linear_0")])
        # Blocks: a few of the 2048 channels after the GELU are far larger
        # than the rest, and one int8 scale for a whole row of them loses the
        # others (the states 0.20 off, relative, against 0.04 with float
        # weights here). MatMulNBits quantises the activations a block of 32
        # channels at a time, so an outlier costs only its block: the states
        # are as close to the float graph's as with float weights (0.047-0.089
        # on five read sentences, against 0.046-0.089), for a quarter of the
        # memory (16 MB less a session) and 10-17 % less encoder time.
        x = g.node("Add", [x, g.dense(h, prefix + "/ffn/linear_1", blocks=True)])
        layer += 1
    g.node("Identity", [g.layer_norm(x, "encoder/layer_norm")], "encoded")
    return g.model("whisper_encoder", inputs, outputs)


def heads(weights: dict[str, np.ndarray], half: str) -> int:
    """The attention heads of the model's ``encoder`` or ``decoder``."""
    return int(weights[f"{half}/num_heads"].reshape(-1)[0])
