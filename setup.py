"""The build's one addition to pyproject.toml: the demo page and the browser
SDK (``web/`` at the top of the checkout, an npm-packable folder of its
own) are copied into the wheel as ``voice_agent/web``, so an installed
wheel serves them. An editable install serves them from the checkout."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

WEB = Path(__file__).resolve().parent / "web"


class BuildWithWeb(build_py):
    def run(self) -> None:
        super().run()
        if not self.editable_mode:
            shutil.copytree(
                WEB,
                Path(self.build_lib) / "voice_agent" / "web",
                dirs_exist_ok=True,
                ignore=shutil.ignore_patterns("node_modules", "*.tgz"),
            )


setup(cmdclass={"build_py": BuildWithWeb})
