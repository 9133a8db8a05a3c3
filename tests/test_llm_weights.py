"""The packaged LLM weights converted to Q8_0 (backends/llm/weights.py), on the real
packaged SmolLM2 file. Serving the converted file is what every test that
starts the embedded LLM through the Engine does (Q8_0 is the default)."""

from __future__ import annotations

import logging
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import quants

from voice_agent.backends.llm.llama_server import default_model_path
from voice_agent.backends.llm.weights import converted_path, weights_for


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return weights_for(default_model_path(), "q8_0", tmp_path_factory.mktemp("cache"))


@pytest.mark.models
@pytest.mark.slow
def test_a_conversion_keeps_every_tensor_and_field_and_requantises_only_the_q4_1_layers(
    converted: Path,
) -> None:
    assert converted != default_model_path() and converted.is_file()
    assert [p.name for p in converted.parent.iterdir()] == [converted.name]  # no staging file
    assert converted.stat().st_mode & 0o777 == 0o644  # other users of the cache can read it
    packaged = gguf.GGUFReader(default_model_path())
    reader = gguf.GGUFReader(converted)

    def fields(r: gguf.GGUFReader) -> dict[str, tuple[object, list[gguf.GGUFValueType]]]:
        skipped = ("GGUF.kv_count", "GGUF.tensor_count", "GGUF.version", "general.file_type")
        return {f.name: (f.contents(), f.types) for f in r.fields.values() if f.name not in skipped}

    assert fields(reader) == fields(packaged)  # vocabulary, chat template, their types
    assert reader.fields["general.file_type"].contents() == gguf.LlamaFileType.MOSTLY_Q8_0

    old = {t.name: t for t in packaged.tensors}
    assert [t.name for t in reader.tensors] == list(old)
    requantised = 0
    for tensor in reader.tensors:
        before = old[tensor.name]
        assert list(tensor.shape) == list(before.shape)
        if before.tensor_type != gguf.GGMLQuantizationType.Q4_1:
            assert tensor.tensor_type == before.tensor_type
            assert np.array_equal(tensor.data, before.data)
            continue
        requantised += 1
        assert tensor.tensor_type == gguf.GGMLQuantizationType.Q8_0
        was = quants.dequantize(before.data, before.tensor_type).reshape(-1, 32)
        now = quants.dequantize(tensor.data, tensor.tensor_type).reshape(-1, 32)
        # Q8_0 keeps each value within 1/16 of its 32-value block's Q4_1 step.
        q4_1_step = (was.max(axis=1) - was.min(axis=1)) / 15
        assert np.all(np.abs(now - was).max(axis=1) <= q4_1_step / 16 + 1e-6)
    assert requantised == 210


@pytest.mark.models
@pytest.mark.slow
def test_a_converted_file_is_made_once_then_reused(converted: Path) -> None:
    made = converted.stat().st_mtime_ns
    again = weights_for(default_model_path(), "q8_0", converted.parent)
    assert again == converted and again.stat().st_mtime_ns == made
    assert weights_for(default_model_path(), "packaged", converted.parent) == default_model_path()


def test_a_file_that_cannot_be_converted_is_served_as_it_is_and_leaves_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    not_a_model = tmp_path / "notes.gguf"
    not_a_model.write_bytes(b"GGUF" + bytes(4096))
    with caplog.at_level(logging.WARNING):
        assert weights_for(not_a_model, "q8_0", cache) == not_a_model
    assert "could not be converted" in caplog.text
    assert list(cache.iterdir()) == []
    assert not converted_path(not_a_model, "q8_0", cache).exists()


def test_an_unwritable_cache_serves_the_packaged_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with caplog.at_level(logging.WARNING):
        assert weights_for(default_model_path(), "q8_0", blocked / "cache") == default_model_path()
    (warning,) = [r for r in caplog.records if "could not be converted" in r.getMessage()]
    assert str(blocked) in warning.error  # type: ignore[attr-defined]
