"""Find data shipped inside installed packages without importing them (some
weight-only packages import runtimes we don't install)."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def _find(module: str) -> importlib.machinery.ModuleSpec | None:
    # find_spec raises instead of answering None when a parent package is
    # missing, or when an import hook refuses the name.
    try:
        return importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return None


def is_installed(module: str) -> bool:
    return _find(module) is not None


def package_dir(package: str) -> Path | None:
    spec = _find(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))
