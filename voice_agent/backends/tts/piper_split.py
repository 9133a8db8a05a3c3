"""A Piper voice cut in two, so a piece's first audio comes before its last.

A Piper voice (VITS) is one ONNX graph: phoneme ids -> text encoder,
durations and flow -> latent frames (one per 256 output samples) -> the
HiFi-GAN decoder -> audio. The decoder is most of the work (about 60-75 %
of a short piece here) and it is convolutional: each output sample depends
only on latent frames nearby. So the graph is split at the decoder's input
(``/dec/conv_pre``, the name every Piper export gives it), the encoder runs
once per sentence, and the decoder runs on windows of frames with
``CONTEXT_FRAMES`` of overlap on each side, whose middles join sample for
sample (measured: at most 3e-6 of full scale apart with 12 frames of
context, 5e-2 with 4).

A voice without that node, a multi-speaker voice (its decoder is also
conditioned on the speaker) or a machine without the ``onnx`` package keeps
the whole graph: ``split_voice`` returns None and the piece is made at once.

Cutting the graph takes the ``onnx`` package (imported for it alone) and
holds three copies of the voice's weights while it runs (the TTS step of a
start 0.23-0.28 s longer than reading the cut, bench/RESULTS.md); so the
halves are kept on disk (runtime/derived_cache.py), a folder a voice, with
ONNX Runtime's CPU-independent rewrites applied (onnx_options.rewritten:
the encoder half's session is made in about half the time), keyed by the
voice file, this file's source, the onnx version and onnx_options.VERSION
(ONNX Runtime's and the rewrite's), and a later start only reads them.
Halves the runtime cannot load are removed, and cut again at the next
start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import onnxruntime

from voice_agent.backends.runtime.derived_cache import content_key, forget, read_or_build
from voice_agent.backends.runtime.onnx_options import VERSION, rewritten, session_from_bytes
from voice_agent.backends.stt.whisper_weights import cache_root

log = logging.getLogger(__name__)

DECODER_INPUT_NODE = "/dec/conv_pre/Conv"
ENCODER_INPUTS = ("input", "input_lengths", "scales")
# Frames decoded on each side of a window and then dropped: the decoder's
# reach. 12 joins exactly (above); each window costs 2 x 12 frames more.
CONTEXT_FRAMES = 12
# The first window: about 280 ms of audio (256 samples a frame at 22.05 kHz),
# which plays while the next, twice as long, is decoded.
FIRST_WINDOW_FRAMES = 24
CACHE_FOLDER = "piper-halves"  # a folder a voice in it
# Halves of this many keys of one voice stay (63 MB a key for "joe").
KEPT_KEYS = 2


@dataclass(frozen=True)
class VoiceHalves:
    encoder: onnxruntime.InferenceSession  # phoneme ids, lengths, scales -> latent frames
    decoder: onnxruntime.InferenceSession  # latent frames -> audio
    latent: str  # the tensor between them
    hop: int  # output samples per latent frame

    def encode(
        self,
        phoneme_ids: list[int],
        scales: np.ndarray,
        options: onnxruntime.RunOptions | None = None,
    ) -> np.ndarray:
        """Latent frames ``[1, channels, frames]`` of one sentence."""
        ids = np.asarray([phoneme_ids], dtype=np.int64)
        feeds = {
            "input": ids,
            "input_lengths": np.asarray([ids.shape[1]], dtype=np.int64),
            "scales": scales,
        }
        latent: np.ndarray = self.encoder.run(None, feeds, options)[0]
        return latent

    def decode(
        self,
        latent: np.ndarray,
        start: int,
        end: int,
        options: onnxruntime.RunOptions | None = None,
    ) -> np.ndarray:
        """Float audio of frames ``[start, end)``, decoded with their context."""
        frames = latent.shape[2]
        lo, hi = max(0, start - CONTEXT_FRAMES), min(frames, end + CONTEXT_FRAMES)
        feeds = {self.latent: latent[:, :, lo:hi]}
        audio = self.decoder.run(None, feeds, options)[0].reshape(-1)
        skip = (start - lo) * self.hop
        decoded: np.ndarray = audio[skip : skip + (end - start) * self.hop]
        return decoded


def windows(frames: int) -> Iterator[tuple[int, int]]:
    """Frame ranges to decode in turn: the first short, then each twice the
    one before (the last takes up to half as much again rather than leave a
    sliver), so at the decoder's pace (about 1/20 of real time here) each is
    ready long before the one before it has played."""
    start, size = 0, FIRST_WINDOW_FRAMES
    while start < frames:
        end = frames if frames - start < size + size // 2 else start + size
        yield start, end
        start, size = end, size * 2


def split_voice(
    path: Path,
    options: onnxruntime.SessionOptions,
    hop: int,
    speakers: int,
    cache: Path | None = None,
) -> VoiceHalves | None:
    """The voice's encoder and decoder as two sessions, or None (see above)."""
    if speakers > 1:
        return None
    try:
        onnx_version = metadata.version("onnx")
    except metadata.PackageNotFoundError:
        log.info("onnx unavailable: each Piper piece is made at once", extra={"voice": str(path)})
        return None
    try:
        key = content_key(path, Path(__file__), extra=f"onnx {onnx_version}, {VERSION}")
        folder: Path | None = (cache or cache_root()) / CACHE_FOLDER / path.stem
    except (OSError, RuntimeError) as exc:  # no source file, no home: cut without a cache
        log.info("piper halves not cached", extra={"voice": str(path), "error": repr(exc)})
        key, folder = "", None
    if folder is None:
        halves = _cut(path)
    else:
        halves = read_or_build(folder, ("encoder", "decoder"), key, lambda: _cut(path), KEPT_KEYS)
    if halves is None:
        return None
    try:
        encoder, decoder = (session_from_bytes(half, options) for half in halves)
        (latent,) = decoder.get_inputs()  # the tensor between them
    except Exception:  # a cached file ONNX Runtime cannot load: the whole graph serves
        log.warning(
            "cannot load the Piper voice's halves: each piece is made at once",
            exc_info=True,
            extra={"voice": str(path), "cache": str(folder)},
        )
        if folder is not None:
            forget(folder, key)  # cut again at the next start
        return None
    return VoiceHalves(encoder, decoder, latent.name, hop)


def _cut(path: Path) -> list[bytes] | None:
    """The voice's graph cut at the decoder's input: the encoder's and the
    decoder's serialized graphs, or None where it cannot be cut."""
    try:
        import onnx
        from onnx.utils import Extractor
    except Exception as exc:  # a protobuf it cannot work with
        log.info(
            "onnx unavailable: each Piper piece is made at once",
            extra={"voice": str(path), "error": repr(exc)},
        )
        return None
    try:
        model = onnx.load(str(path))
        node = next((n for n in model.graph.node if n.name == DECODER_INPUT_NODE), None)
        inputs = {i.name for i in model.graph.input}
        if node is None or not set(ENCODER_INPUTS) <= inputs or len(model.graph.output) != 1:
            log.info(
                "not a Piper VITS graph: each piece is made at once", extra={"voice": str(path)}
            )
            return None
        latent = node.input[0]
        extractor = Extractor(model)
        encoder = extractor.extract_model(list(ENCODER_INPUTS), [latent])
        decoder = extractor.extract_model([latent], [model.graph.output[0].name])
        return [rewritten(half.SerializeToString()) for half in (encoder, decoder)]
    except Exception:  # another export's graph: the whole one still serves
        log.warning(
            "cannot split the Piper voice: each piece is made at once",
            exc_info=True,
            extra={"voice": str(path)},
        )
        return None
