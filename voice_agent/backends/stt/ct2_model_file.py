"""Read the variables of a CTranslate2 ``model.bin`` as numpy arrays.

The packaged Whisper base is a CTranslate2 model whose weights are stored as
float16 (CTranslate2 quantises them when it loads them). Reading the file
directly lets another runtime use the same weights (whisper_onnx_decoder.py)
without a second copy of them in a package.

The layout (CTranslate2's ``Model::load``, binary versions 4-6): a uint32
version, the spec's name, a uint32 revision, a uint32 variable count, then
per variable its name, a uint8 rank, the uint32 dimensions, a uint8 type id,
a uint32 byte count and the bytes; then the aliases (name -> variable).
Strings are a uint16 length (with the terminating NUL) and the bytes.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

# CTranslate2's DataType ids (include/ctranslate2/types.h).
_DTYPES: dict[int, type[np.generic]] = {
    0: np.float32,
    1: np.int8,
    2: np.int16,
    3: np.int32,
    4: np.float16,
}
SUPPORTED_VERSIONS = (4, 5, 6)


class Ct2FormatError(ValueError):
    pass


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.offset = 0

    def unpack(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += struct.calcsize(fmt)
        return int(value)

    def string(self) -> str:
        length = self.unpack("<H")
        raw = self.data[self.offset : self.offset + length]
        self.offset += length
        return raw.rstrip(b"\0").decode()


def read_variables(path: Path) -> dict[str, np.ndarray]:
    """Every variable of the model, aliases resolved (views into one buffer)."""
    data = path.read_bytes()
    cursor = _Cursor(data)
    version = cursor.unpack("<I")
    if version not in SUPPORTED_VERSIONS:
        raise Ct2FormatError(f"{path}: CTranslate2 model version {version} is not supported")
    cursor.string()  # the spec's name, e.g. WhisperSpec
    cursor.unpack("<I")  # its revision
    variables: dict[str, np.ndarray] = {}
    for _ in range(cursor.unpack("<I")):
        name = cursor.string()
        rank = cursor.unpack("<B")
        shape = [cursor.unpack("<I") for _ in range(rank)]
        type_id = cursor.unpack("<B")
        size = cursor.unpack("<I")
        dtype = _DTYPES.get(type_id)
        if dtype is None:
            raise Ct2FormatError(f"{path}: {name} has an unsupported type id {type_id}")
        count = size // np.dtype(dtype).itemsize
        array = np.frombuffer(data, dtype=dtype, count=count, offset=cursor.offset)
        variables[name] = array.reshape(shape) if rank else array
        cursor.offset += size
    for _ in range(cursor.unpack("<I")):
        alias, target = cursor.string(), cursor.string()
        variables[alias] = variables[target]
    return variables
