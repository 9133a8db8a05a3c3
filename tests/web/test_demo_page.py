"""The demo page end to end in headless Chromium: a recorded question goes in
through the fake microphone, the real models answer, and the reply's audio
arrives in the browser."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.async_api import Page, Playwright

from tests.conftest import ServerFactory
from voice_agent.testing.audio_data import RATE, librivox, reference, silence, word_error_rate
from voice_agent.testing.browser import ARTIFACTS, chromium, write_capture_wav

pytestmark = [pytest.mark.e2e, pytest.mark.browser, pytest.mark.slow]

# Chromium loops the capture file: the silence after the question is long
# enough that it is asked only once during the test.
QUESTION = "0930"

INBOUND_AUDIO = """
async () => {
  const pc = window.voiceAgent.agent?.pc;
  if (!pc) return null;
  for (const s of (await pc.getStats()).values()) {
    if (s.type === 'inbound-rtp' && s.kind === 'audio') {
      return { energy: s.totalAudioEnergy ?? 0, packets: s.packetsReceived ?? 0 };
    }
  }
  return null;
}
"""


async def inbound_audio(page: Page) -> dict[str, Any]:
    stats = await page.evaluate(INBOUND_AUDIO)
    assert stats is not None, "no inbound audio stream"
    return dict(stats)


async def test_the_demo_page_answers_a_spoken_question(
    playwright: Playwright, server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = await server_factory()
    # Lead-in silence: the call is up before the question starts.
    samples = np.concatenate((silence(3.0), librivox(QUESTION), silence(60.0)))
    wav = write_capture_wav(tmp_path / "question.wav", samples, RATE)
    ARTIFACTS.mkdir(exist_ok=True)
    async with chromium(playwright, capture_wav=wav) as browser:
        page = await browser.new_page(viewport={"width": 1000, "height": 800})
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        await page.goto(server.url + "/")
        assert await page.text_content("#status") == "disconnected"
        await page.click("#connect")
        await page.wait_for_function("window.voiceAgent.state === 'listening'", timeout=20_000)
        assert await page.text_content("#connect") == "Hang up"
        assert len(server.calls) == 1
        silent = await inbound_audio(page)  # before the reply: the server sends silence

        # The user's words appear, then the assistant's answer.
        user = page.locator(".turn.user:not(.pending) .text")
        await user.first.wait_for(timeout=60_000)
        heard = await user.first.text_content()
        assert heard is not None
        assert word_error_rate(reference(QUESTION), heard) <= 0.3, heard
        answer = page.locator(".turn.assistant:not(.pending) .text")
        await answer.first.wait_for(timeout=60_000)
        reply = await answer.first.text_content()
        assert reply and reply.strip()
        latency = page.locator(".latency")
        await latency.first.wait_for(timeout=10_000)
        assert "voice-to-voice" in (await latency.first.text_content() or "")

        # The reply's audio reached the browser: energy well above the silence.
        await page.wait_for_function("window.voiceAgent.state === 'listening'", timeout=30_000)
        spoken = await inbound_audio(page)
        assert spoken["packets"] > silent["packets"]
        assert spoken["energy"] - silent["energy"] > 0.01, (silent, spoken)

        states = [e["type"] for e in await page.evaluate("window.voiceAgent.events")]
        assert "output_audio_buffer.started" in states
        assert await page.is_hidden("#error"), await page.text_content("#error")
        # The microphone picker lists the (fake) devices once access was granted.
        assert await page.locator("#microphone option").count() >= 2

        # The voice picker offers the server's voices (GET /v1/voices).
        await page.click("#settings summary")
        offered = await page.eval_on_selector_all("#voice option", "os => os.map(o => o.value)")
        assert offered == ["", "joe"], offered
        # Settings go to the server. A voice it does not have (a list from
        # before the server changed its voices) is refused, the whole update
        # (nothing changes), and the page names the ones it has.
        await page.evaluate("document.querySelector('#voice').add(new Option('alloy', 'alloy'))")
        await page.fill("#instructions", "Answer like a pirate.")
        await page.select_option("#voice", "alloy")
        await page.click("#apply")
        note = page.locator("#settings-note")
        await page.wait_for_function("document.querySelector('#settings-note').textContent")
        refused = await note.text_content() or ""
        assert refused.startswith("Not applied") and "'joe'" in refused, refused
        (call,) = server.calls.calls()
        assert call.session.conversation.instructions != "Answer like a pirate."
        await page.select_option("#voice", "joe")
        await page.click("#apply")
        await page.wait_for_function(
            "document.querySelector('#settings-note').textContent === 'Applied.'"
        )
        assert call.session.voice == "joe"
        assert call.session.conversation.instructions == "Answer like a pirate."
        await page.screenshot(path=str(ARTIFACTS / "demo-desktop.png"), full_page=True)

        # On a phone-sized screen nothing overflows sideways.
        await page.set_viewport_size({"width": 375, "height": 740})
        overflow = await page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0
        assert await page.locator("#connect").is_visible()
        await page.screenshot(path=str(ARTIFACTS / "demo-phone.png"), full_page=True)

        # Hanging up releases the call on the server and the microphone here.
        await page.click("#connect")
        assert await page.text_content("#status") == "disconnected"
        await asyncio.wait_for(server.calls.wait_for_count(0), 10)
        assert not [line for line in console if line.startswith("error")], console
