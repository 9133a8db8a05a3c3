"""The ONNX Runtime options every model session shares
(backends/runtime/onnx_options.py): 8-bit products exact on any x86 CPU."""

from __future__ import annotations

from voice_agent.backends.runtime.int8_probe import WIDTH, products_exact, saturating_product


def test_an_8_bit_product_does_not_saturate() -> None:
    # Every activation quantises to 255 and every weight is 127: two such
    # products make 64,770, past the 16-bit sum the AVX2 kernel keeps
    # without VNNI (there the default options gave 32.4 here, not 64).
    product = saturating_product()
    assert products_exact(product), product
    assert not products_exact(WIDTH / 2)
