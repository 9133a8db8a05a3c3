"""Whether ONNX Runtime, with the service's session options, multiplies
8-bit values exactly on this CPU: the product of values chosen to saturate
the 16-bit sums of x86's kernel without VNNI (onnx_options.py says why
that matters). ``voice-agent check`` shows it; it builds a graph, so it
imports onnx, which the service itself does not need for this."""

from __future__ import annotations

import numpy as np

from voice_agent.backends.runtime.onnx_options import quiet_session_options, session_from_bytes

WIDTH = 64  # the exact product below


def _product_graph() -> bytes:
    """``x @ w`` with ``w`` int8 and ``x`` quantised on the fly, as Whisper's
    encoder multiplies (whisper_onnx_graphs.py); Smart Turn's fused int8
    matrix products run on the same 8-bit GEMM kernels."""
    from onnx import TensorProto, helper, numpy_helper

    initializers = [
        numpy_helper.from_array(np.full((WIDTH, 1), 127, dtype=np.int8), "w"),
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


def saturating_product() -> float:
    """Ones (each quantised to 255) times 127s (each 1.0): exactly WIDTH.
    Two such products make 64,770, past a 16-bit sum; a kernel that
    saturates gives about half."""
    session = session_from_bytes(_product_graph(), quiet_session_options(1))
    (y,) = session.run(None, {"x": np.ones((1, WIDTH), dtype=np.float32)})
    return float(np.asarray(y).reshape(-1)[0])


def products_exact(product: float) -> bool:
    return abs(product - WIDTH) < 0.5
