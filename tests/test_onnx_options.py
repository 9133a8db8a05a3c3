"""The ONNX Runtime options every model session shares
(backends/runtime/onnx_options.py): 8-bit products exact on any x86 CPU."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from voice_agent.backends.runtime.onnx_options import quiet_session_options, session_from_bytes

WIDTH = 64


def _product_graph() -> bytes:
    """``x @ w`` with ``w`` int8 and ``x`` quantised on the fly, as Whisper's
    encoder multiplies (whisper_onnx_graphs.py): the kernel Smart Turn's
    int8 layers are fused into too."""
    weight = np.full((WIDTH, 1), 127, dtype=np.int8)
    initializers = [
        numpy_helper.from_array(weight, "w"),
        numpy_helper.from_array(np.array([1 / 127], dtype=np.float32), "scale"),
        numpy_helper.from_array(np.zeros(1, dtype=np.int8), "zero"),
    ]
    node = helper.make_node(
        "DynamicQuantizeMatMul", ["x", "w", "scale", "zero"], ["y"], domain="com.microsoft"
    )
    graph = helper.make_graph(
        [node],
        "product",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        initializers,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def test_an_8_bit_product_does_not_saturate() -> None:
    # Every activation quantises to 255 and every weight is 127: two such
    # products make 64,770, past the 16-bit sum the AVX2 kernel keeps
    # without VNNI (there the default options gave ~32 here, not 64).
    session = session_from_bytes(_product_graph(), quiet_session_options(1))
    (y,) = session.run(None, {"x": np.ones((1, WIDTH), dtype=np.float32)})
    assert abs(float(y[0, 0]) - WIDTH) < 0.5, y
