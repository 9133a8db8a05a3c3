"""Files derived from a model file, kept on disk (backends/runtime/derived_cache.py)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.logged import Logged
from voice_agent.backends.runtime import derived_cache
from voice_agent.backends.runtime.derived_cache import content_key, forget, read_or_build


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.bin"
    path.write_bytes(b"weights" * 1000)
    return path


@pytest.fixture
def builder(tmp_path: Path) -> Path:
    path = tmp_path / "builder.py"
    path.write_text("# how the files are made\n")
    return path


def test_the_key_follows_the_model_the_code_and_the_extra(model: Path, builder: Path) -> None:
    key = content_key(model, builder)
    assert content_key(model, builder) == key
    assert content_key(model, builder, extra="1.19.0") != key
    builder.write_text("# made another way\n")
    os.utime(builder, ns=(1, 1))  # a new modification time, as an edit makes
    assert content_key(model, builder) != key
    changed = content_key(model, builder)
    model.write_bytes(b"other weights")
    assert content_key(model, builder) != changed


def test_the_key_hashes_the_builder_then_the_model(model: Path, builder: Path) -> None:
    # A cache written by one build is read by another as long as this holds.
    expected = hashlib.sha256(builder.read_bytes() + model.read_bytes()).hexdigest()[:16]
    assert content_key(model, builder) == expected


def test_forgotten_files_are_made_again(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    read_or_build(folder, ("a", "b"), "k1", lambda: [b"1", b"2"], kept=2)
    read_or_build(folder, ("a", "b"), "k2", lambda: [b"3", b"4"], kept=2)
    forget(folder, "k1")
    assert sorted(p.name for p in folder.iterdir()) == ["a-k2.onnx", "b-k2.onnx"]
    assert read_or_build(folder, ("a", "b"), "k1", lambda: [b"5", b"6"], kept=2) == [b"5", b"6"]


def test_files_are_made_once_then_read(tmp_path: Path) -> None:
    made: list[int] = []

    def build() -> list[bytes]:
        made.append(1)
        return [b"encoder", b"decoder"]

    folder = tmp_path / "cache"
    first = read_or_build(folder, ("encoder", "decoder"), "k1", build, kept=2)
    again = read_or_build(folder, ("encoder", "decoder"), "k1", build, kept=2)
    assert first == again == [b"encoder", b"decoder"]
    assert len(made) == 1
    assert sorted(p.name for p in folder.iterdir()) == ["decoder-k1.onnx", "encoder-k1.onnx"]


def test_nothing_is_kept_when_there_is_nothing_to_keep(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    assert read_or_build(folder, ("whole",), "k1", lambda: None, kept=2) is None
    assert not folder.exists()


def test_only_the_newest_keys_stay(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    read_or_build(folder, ("half",), "kept", lambda: [b"x"], kept=2)
    read_or_build(folder, ("half",), "aged", lambda: [b"x"], kept=2)
    os.utime(folder / "half-aged.onnx", (1, 1))  # long ago
    read_or_build(folder, ("half",), "last", lambda: [b"x"], kept=2)
    assert sorted(p.name for p in folder.iterdir()) == ["half-kept.onnx", "half-last.onnx"]


async def test_a_cache_that_cannot_be_written_only_costs_time(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder would go")
    with Logged(derived_cache.__name__) as logged:
        built = read_or_build(blocked / "cache", ("half",), "k1", lambda: [b"x"], kept=2)
    assert built == [b"x"]
    assert any("made on every start" in r.getMessage() for r in logged.records)
