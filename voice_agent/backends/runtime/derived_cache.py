"""Files derived from a model file (graphs built or cut from it) kept on
disk, so a start reads them instead of making them again.

Each set of files is keyed by the model file's contents and the source of
the code that derives them: a new model, or a change to how the files are
made, gives a new key, and an old file is never reused. The newest few keys
of a folder stay; older ones are removed when a new set is written. A cache
that cannot be written (read-only, full) only means deriving the files on
every start, and a crash never leaves a partial file under a final name.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger(__name__)


def content_key(model_file: Path, builder: Path, extra: str = "") -> str:
    """A key of the model file's contents, the deriving code's source
    (``builder``) and anything else the files depend on (``extra``: a
    library's version). Hashed once a process while the files stay as they
    are."""
    model, code = model_file.resolve(), builder.resolve()
    found, written = model.stat(), code.stat()
    return _key(str(model), found.st_size, found.st_mtime_ns, str(code), written.st_mtime_ns, extra)


@functools.lru_cache(maxsize=8)
def _key(model: str, size: int, modified_ns: int, code: str, code_ns: int, extra: str) -> str:
    digest = hashlib.sha256(Path(code).read_bytes())
    digest.update(extra.encode())
    with open(model, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def read_or_build(
    folder: Path,
    stems: Sequence[str],
    key: str,
    build: Callable[[], list[bytes] | None],
    kept: int,
) -> list[bytes] | None:
    """The files ``<stem>-<key>.onnx`` in ``folder``, or, when any is missing,
    ``build()``'s (None: nothing to keep), written there and the folder
    pruned to its ``kept`` newest keys."""
    paths = [folder / f"{stem}-{key}.onnx" for stem in stems]
    try:
        return [path.read_bytes() for path in paths]
    except OSError:
        pass  # not made yet (or unreadable): make them
    built = build()
    if built is None:
        return None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, data in zip(paths, built, strict=True):
            write_atomically(path, data)
        prune(folder, kept)
    except OSError as exc:
        log.warning(
            "derived model files not cached: made on every start",
            extra={"cache": str(folder), "error": str(exc)},
        )
    return built


def prune(folder: Path, kept: int) -> None:
    """Remove the files of all but the ``kept`` newest keys (a file another
    process removed meanwhile is skipped)."""
    newest: dict[str, float] = {}
    for path in folder.glob("*-*.onnx"):
        key = path.stem.rsplit("-", 1)[1]
        try:
            newest[key] = max(newest.get(key, 0.0), path.stat().st_mtime)
        except FileNotFoundError:
            continue
    for key in sorted(newest, key=newest.__getitem__, reverse=True)[kept:]:
        forget(folder, key)


def forget(folder: Path, key: str) -> None:
    """Remove every file of ``key``: the next start makes them again."""
    for path in folder.glob(f"*-{key}.onnx"):
        path.unlink(missing_ok=True)


def write_atomically(path: Path, data: bytes) -> None:
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
