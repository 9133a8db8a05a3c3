"""The source checkout this package sits in, for the files the tests and
benchmarks read from it (recordings, SIP scenarios, the SIP gateway's
scripts) rather than from the package: they are not part of an installed
wheel. An editable install (``pip install -e .``) runs from the checkout."""

from __future__ import annotations

from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]


def in_checkout(relative: str) -> Path:
    """``relative`` (a path from the top of the checkout), which must exist:
    a clear error when this package runs from somewhere else."""
    path = CHECKOUT / relative
    if not path.exists():
        raise FileNotFoundError(
            f"{relative} is not at {path}: voice_agent.testing reads it from the source "
            "checkout it is installed from (pip install -e .), and this copy has none"
        )
    return path
