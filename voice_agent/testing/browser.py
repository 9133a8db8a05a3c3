"""Real headless Chromium for the web tests and bench/browser.py, driven by
Playwright (a dev dependency, imported here).

The system's Chromium is used (never a browser download): `.ci/run` installs
Debian's `chromium` when it is missing. Without it the web tests fail with a
clear message rather than skipping, so CI cannot pass them silently.
Screenshots and recordings go to the checkout's ``test-artifacts``.
"""

from __future__ import annotations

import shutil
import wave
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import soxr
from playwright.async_api import Browser, Playwright

from voice_agent.testing.checkout import CHECKOUT

ARTIFACTS = CHECKOUT / "test-artifacts"
FAKE_CAPTURE_RATE = 48_000

BASE_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--autoplay-policy=no-user-gesture-required",
    # Offer real host addresses: mDNS names cannot be resolved by the server.
    "--disable-features=WebRtcHideLocalIpsWithMdns",
]


def chromium_path() -> str:
    """The system Chromium; RuntimeError, saying how to install it, without one."""
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        raise RuntimeError(
            "the web tests need Chromium: install it with `apt-get install -y chromium` "
            "(.ci/run does this on CI)"
        )
    return path


def write_capture_wav(path: Path, samples: np.ndarray, rate: int) -> Path:
    """Mono 16-bit WAV for --use-file-for-fake-audio-capture (Chromium loops it)."""
    audio = samples.astype(np.float32) / 32768.0
    if rate != FAKE_CAPTURE_RATE:
        audio = soxr.resample(audio, rate, FAKE_CAPTURE_RATE)
    pcm = np.clip(audio * 32768.0, -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(FAKE_CAPTURE_RATE)
        handle.writeframes(pcm.tobytes())
    return path


@asynccontextmanager
async def chromium(
    playwright: Playwright, *, capture_wav: Path | None = None, fake_ui: bool = True
) -> AsyncIterator[Browser]:
    """Headless Chromium with a fake microphone (silence, or ``capture_wav``).

    ``fake_ui`` grants the microphone without a prompt; without it the
    browser context decides (tests deny it there)."""
    args = [*BASE_ARGS, "--use-fake-device-for-media-stream"]
    if fake_ui:
        args.append("--use-fake-ui-for-media-stream")
    if capture_wav is not None:
        args.append(f"--use-file-for-fake-audio-capture={capture_wav}")
    browser = await playwright.chromium.launch(executable_path=chromium_path(), args=args)
    try:
        yield browser
    finally:
        await browser.close()
