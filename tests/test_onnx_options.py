"""The ONNX Runtime options every model session shares
(backends/runtime/onnx_options.py): 8-bit products exact on any x86 CPU."""

from __future__ import annotations

import pytest

from voice_agent.backends.runtime.int8_probe import WIDTH, products_exact, saturating_product
from voice_agent.backends.runtime.onnx_options import (
    SATURATING_INT8,
    X64_QUANT_PRECISION,
    quiet_session_options,
    saturating_int8,
)


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
