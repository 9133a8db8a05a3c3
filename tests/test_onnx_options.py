"""The ONNX Runtime options every model session shares
(backends/runtime/onnx_options.py): 8-bit products exact on any x86 CPU;
graphs cached with their CPU-independent rewrites done answer the same."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from voice_agent.backends.runtime.int8_probe import WIDTH, products_exact, saturating_product
from voice_agent.backends.runtime.onnx_options import (
    SATURATING_INT8,
    X64_QUANT_PRECISION,
    quiet_session_options,
    rewritten,
    saturating_int8,
    session_from_bytes,
)
from voice_agent.backends.stt import whisper_weights
from voice_agent.backends.stt.whisper_graph_cache import encoder_graph
from voice_agent.backends.tts.piper_tts import default_voice_path


def test_an_8_bit_product_does_not_saturate() -> None:
    # Every activation quantises to 255 and every weight is 127: two such
    # products make 64,770, past the 16-bit sum the AVX2 kernel keeps
    # without VNNI (there ONNX Runtime's default options give 32.4, not 64).
    product = saturating_product()
    assert products_exact(product), product
    assert not products_exact(WIDTH / 2)


@pytest.mark.parametrize(
    ("flags", "machine", "saturates"),
    [
        ({"avx2", "fma"}, "x86_64", True),  # AVX2 alone: the AMD EPYC of these figures
        ({"avx2", "avx512f", "avx512bw"}, "x86_64", True),  # AVX-512 without VNNI
        ({"avx2", "avx_vnni"}, "x86_64", False),
        ({"avx2", "avx512f", "avx512_vnni"}, "x86_64", False),
        ({"avx2", "avx512_vnni", "amx_int8"}, "x86_64", False),
        (set(), "x86_64", True),  # flags unknown: the exact kernel, to be safe
        ({"asimd", "asimddp"}, "aarch64", False),  # no such kernel off x86
    ],
)
def test_the_exact_kernel_is_asked_for_where_the_default_saturates(
    flags: set[str], machine: str, saturates: bool
) -> None:
    assert saturating_int8(frozenset(flags), machine) is saturates


def test_the_sessions_ask_for_it_on_this_cpu_as_it_needs() -> None:
    options = quiet_session_options(1)
    if SATURATING_INT8:
        assert options.get_session_config_entry(X64_QUANT_PRECISION) == "1"
    else:  # VNNI or AMX: their own kernel, exact and faster
        with pytest.raises(RuntimeError, match="does not have configuration"):
            options.get_session_config_entry(X64_QUANT_PRECISION)


@pytest.mark.models
def test_a_rewritten_graph_is_smaller_and_answers_bit_for_bit_the_same() -> None:
    # Piper's voice (the shipped one): the heaviest graph a start sets up.
    voice = default_voice_path().read_bytes()
    rewritten_voice = rewritten(voice)
    nodes = len(onnx.load_from_string(voice).graph.node)
    assert len(onnx.load_from_string(rewritten_voice).graph.node) < nodes  # folded and fused
    # No noise (its scales 0): the voice's output is then deterministic.
    feed = {
        "input": np.array([[1, 20, 30, 40, 50, 60, 25, 35, 45, 2]], dtype=np.int64),
        "input_lengths": np.array([10], dtype=np.int64),
        "scales": np.array([0.0, 1.0, 0.0], dtype=np.float32),
    }
    audio = [
        session_from_bytes(graph, quiet_session_options(1)).run(None, feed)[0]
        for graph in (voice, rewritten_voice)
    ]
    assert audio[0].size >= 256 * 10 and np.abs(audio[0]).max() > 0.01  # a hop a phoneme, loud
    assert np.array_equal(audio[0], audio[1])


@pytest.mark.models
def test_a_rewritten_graph_keeps_its_weights_as_any_cpu_reads_them(tmp_path: Path) -> None:
    # Whisper's encoder, built into a fresh cache: its 8-bit weights stay
    # signed, as built, whatever kernel this CPU's sessions choose.
    graph = onnx.load_from_string(
        encoder_graph(whisper_weights.resolve("base") / "model.bin", tmp_path)
    )
    weights = {w.name: w.data_type for w in graph.graph.initializer}
    products = [n for n in graph.graph.node if n.op_type == "DynamicQuantizeMatMul"]
    assert products
    assert {weights[n.input[1]] for n in products} == {onnx.TensorProto.INT8}
