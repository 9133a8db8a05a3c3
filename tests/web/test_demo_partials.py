"""Live partial transcripts on the demo page: Parakeet (the tiny NeMo test
model) streams the user's words while they speak, and the page shows them
before the final transcript arrives."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
from playwright.async_api import Playwright

from tests.conftest import RunningServer
from voice_agent.testing.audio_data import RATE, silence, word_error_rate
from voice_agent.testing.browser import chromium, write_capture_wav
from voice_agent.testing.tiny_nemo import PHRASES, phrase_audio

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

# Records, for every partial, what the page's user bubble showed right after
# the demo's own handler ran (it was registered first).
WATCH = """
() => {
  window.partialsSeen = [];
  window.finalSeen = null;
  const agent = window.voiceAgent.agent;
  agent.on('userpartial', ({ text }) => {
    const bubbles = document.querySelectorAll('#transcript .turn.user .text');
    const shown = bubbles.length ? bubbles[bubbles.length - 1].textContent : null;
    window.partialsSeen.push({ text, shown, final: window.finalSeen });
  });
  agent.on('usertranscript', ({ text }) => { window.finalSeen = text; });
}
"""


async def test_partial_words_appear_before_the_final_transcript(
    playwright: Playwright, parakeet_server: RunningServer, tmp_path: Path
) -> None:
    name, expected = PHRASES[1]  # the longer phrase: several partials fit in it
    samples = np.concatenate((silence(3.0), phrase_audio(name), silence(60.0)))
    wav = write_capture_wav(tmp_path / "phrase.wav", samples, RATE)
    async with chromium(playwright, capture_wav=wav) as browser:
        page = await browser.new_page()
        await page.goto(parakeet_server.url + "/")
        await page.click("#connect")
        await page.wait_for_function("window.voiceAgent.state === 'listening'", timeout=20_000)
        await page.evaluate(WATCH)
        await page.wait_for_function("window.finalSeen !== null", timeout=60_000)
        partials = await page.evaluate("window.partialsSeen")
        final = await page.evaluate("window.finalSeen")
        await page.click("#connect")  # hang up
    # The tiny model hears the browser's processed audio almost exactly.
    assert word_error_rate(expected, final) <= 0.2, final
    assert partials, "no partial transcript reached the page"
    for seen in partials:
        assert seen["final"] is None  # every partial came before the final
        assert seen["text"] and seen["shown"] == seen["text"]
    # Partials only ever grow (append-only deltas).
    texts = [seen["text"] for seen in partials]
    assert all(later.startswith(earlier) for earlier, later in itertools.pairwise(texts))
