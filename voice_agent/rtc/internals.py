"""The aiortc and aioice versions whose private internals this package
patches: the data channel's receive path (datachannel.py), the RTP
receiver's packet handler (dtmf.py), its decoder hand-off
(inline_decoding.py), its jitter buffer (arrival_order.py) and aioice's host
address gathering (call.py). pyproject.toml pins exactly these versions;
each patch also asks ``patchable()`` before it touches anything, so a
different version installed by hand runs aiortc as it is (logged once, as
an error, naming what is left unpatched) instead of a patch that no
longer fits.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging

log = logging.getLogger(__name__)

PATCHED_VERSIONS = {"aiortc": "1.16.0", "aioice": "0.13.0"}


def installed_version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _mismatches() -> tuple[str, ...]:
    found = []
    for package, expected in PATCHED_VERSIONS.items():
        installed = installed_version(package)
        if installed != expected:
            found.append(f"{package} {installed or 'missing'} (patched for {expected})")
    return tuple(found)


def patchable(patch: str) -> bool:
    """Whether ``patch`` may touch aiortc's internals: only the versions it
    was written against. Logged once per patch when not."""
    mismatches = _mismatches()
    if mismatches:
        _refuse(patch, mismatches)
    return not mismatches


@functools.cache
def _refuse(patch: str, mismatches: tuple[str, ...]) -> None:
    log.error(
        "aiortc internals not patched: running aiortc unchanged",
        extra={"patch": patch, "installed": ", ".join(mismatches)},
    )
