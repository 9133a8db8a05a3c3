"""Find data shipped inside installed packages without importing them (some
weight-only packages import runtimes we don't install)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))
