"""Which modules a piece of the service imports, asked of a fresh interpreter."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Sequence


def left_imported(code: str, modules: Sequence[str], timeout_s: float = 120) -> list[str]:
    """The ``modules`` a new interpreter has imported once ``code`` has run."""
    asked = tuple(modules)
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {asked!r} if m in sys.modules))\n"
    run = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=timeout_s
    )
    assert run.returncode == 0, run.stdout + run.stderr
    found: list[str] = ast.literal_eval(run.stdout.strip().splitlines()[-1])
    return found
