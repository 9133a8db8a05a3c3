"""Whisper's ONNX graphs (whisper_onnx_graphs.py) kept on disk once built.

Building them takes about a second on 2 cores, on every start; so the
serialized graphs are cached (runtime/derived_cache.py), with ONNX
Runtime's CPU-independent rewrites applied (onnx_options.rewritten), keyed
by the model file's contents, the builder's source, ONNX Runtime's
version and the rewrite's (onnx_options.VERSION); the newest KEPT_KEYS
keys stay.
A cached graph loads without the weights being read, or the onnx package
imported, at all.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from voice_agent.backends.runtime.derived_cache import content_key, read_or_build
from voice_agent.backends.runtime.onnx_options import VERSION, rewritten
from voice_agent.backends.stt.ct2_model_file import read_variables
from voice_agent.backends.stt.whisper_weights import cache_root

if TYPE_CHECKING:
    import onnx

log = logging.getLogger(__name__)

CACHE_FOLDER = "onnx-whisper"
# Graphs of this many model-and-builder keys stay in the cache (another
# model's, the last build's); older ones (~89 MB a key for Whisper base)
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
    key = content_key(model_file, BUILDER, extra=VERSION)

    def serialized() -> list[bytes]:
        return [rewritten(graph.SerializeToString()) for graph in build()]

    graphs = read_or_build(root / CACHE_FOLDER, stems, key, serialized, KEPT_KEYS)
    assert graphs is not None  # the builder always gives graphs
    return graphs


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
