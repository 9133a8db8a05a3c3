"""Whisper's ONNX graphs (whisper_onnx_graphs.py) kept on disk once built.

Building them takes about a second on 2 cores, on every start; so the
serialized graphs are cached, keyed by the model file's contents and the
builder's source: a new model or a change to how graphs are built makes new
files, and an old one is never reused (the newest KEPT_KEYS keys stay). A
cache that cannot be written (read-only, full) only means building them
each time. A cached graph loads without the weights being read, or the
onnx package imported, at all.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from voice_agent.backends.stt.ct2_model_file import read_variables
from voice_agent.backends.stt.whisper_weights import cache_root

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

CACHE_FOLDER = "onnx-whisper"
# Graphs of this many model-and-builder keys stay in the cache (another
# model's, the last build's); older ones (~104 MB a key for Whisper base)
# are removed when a new set is written.
KEPT_KEYS = 3
# A folder that held the decoder's graphs alone (~57 MB for Whisper base),
# which this cache replaces: its graphs are removed when this cache is used.
# (A build that still uses that folder, sharing the cache, would rebuild
# them at each of its starts.)
SUPERSEDED_FOLDERS = ("onnx-whisper-decoder",)
# How the graphs are built, part of their key (read as a file: importing it
# imports onnx).
BUILDER = Path(__file__).with_name("whisper_onnx_graphs.py")


def encoder_graph(model_file: Path, cache: Path | None = None) -> bytes:
    """The serialized encoder graph of the CTranslate2 ``model_file``: from
    the cache when built before, else built now (its weights read only
    then) and cached."""

    def build() -> list[onnx.ModelProto]:
        from voice_agent.backends.stt import whisper_onnx_graphs as graphs

        weights = read_variables(model_file)
        return [graphs.build_encoder_graph(weights, graphs.heads(weights, "encoder"))]

    (encoder,) = _cached(model_file, ("encoder",), build, cache)
    return encoder


def decoder_graphs(model_file: Path, cache: Path | None = None) -> tuple[bytes, bytes]:
    """The serialized step and cross graphs of the CTranslate2 ``model_file``,
    as encoder_graph()."""

    def build() -> list[onnx.ModelProto]:
        from voice_agent.backends.stt import whisper_onnx_graphs as graphs

        weights = read_variables(model_file)
        count = graphs.heads(weights, "decoder")
        return [graphs.build_step_graph(weights, count), graphs.build_cross_graph(weights, count)]

    step, cross = _cached(model_file, ("step", "cross"), build, cache)
    return step, cross


def _cached(
    model_file: Path,
    stems: Sequence[str],
    build: Callable[[], list[onnx.ModelProto]],
    cache: Path | None,
) -> list[bytes]:
    root = cache or cache_root()
    _remove_superseded(root)
    folder = root / CACHE_FOLDER
    key = _key(model_file)
    paths = [folder / f"{stem}-{key}.onnx" for stem in stems]
    try:
        return [path.read_bytes() for path in paths]
    except OSError:
        pass  # not built yet (or unreadable): build
    serialized = [graph.SerializeToString() for graph in build()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, data in zip(paths, serialized, strict=True):
            _write(path, data)
        _prune(folder)
    except OSError as exc:
        log.warning(
            "onnx whisper graphs not cached: built on every start",
            extra={"cache": str(folder), "error": str(exc)},
        )
    return serialized


def _prune(folder: Path) -> None:
    """Remove the graphs of all but the KEPT_KEYS newest keys."""
    newest: dict[str, float] = {}
    for path in folder.glob("*-*.onnx"):
        key = path.stem.rsplit("-", 1)[1]
        newest[key] = max(newest.get(key, 0.0), path.stat().st_mtime)
    for key in sorted(newest, key=newest.__getitem__, reverse=True)[KEPT_KEYS:]:
        for path in folder.glob(f"*-{key}.onnx"):
            path.unlink(missing_ok=True)


def _remove_superseded(root: Path) -> None:
    """The decoder graphs in SUPERSEDED_FOLDERS, and each folder once empty:
    a file of another name stays, and so does its folder; a folder that is
    a link to somewhere else is left alone."""
    for name in SUPERSEDED_FOLDERS:
        old = root / name
        if old.is_symlink() or not old.is_dir():
            continue
        try:
            for stem in ("step", "cross"):
                for path in old.glob(f"{stem}-*.onnx"):
                    path.unlink(missing_ok=True)
            old.rmdir()
        except OSError as exc:  # not ours to remove, or not empty
            log.debug("superseded graph cache left", extra={"cache": str(old), "error": str(exc)})


def _write(path: Path, data: bytes) -> None:
    """Under a temporary name, then renamed: a crash or a full disk never
    leaves a partial file at ``path``."""
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(staging, 0o644)  # readable by the cache's other users
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def _key(model_file: Path) -> str:
    """The model file's contents (about 0.15 s for Whisper base) and the
    builder's source, which says how graphs are built from it. Hashed once
    a process while the file stays as it is (the encoder's graph and the
    decoder's ask in turn)."""
    resolved = model_file.resolve()
    found = resolved.stat()
    return _content_key(str(resolved), found.st_size, found.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _content_key(path: str, size: int, modified_ns: int) -> str:
    digest = hashlib.sha256(BUILDER.read_bytes())
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]
