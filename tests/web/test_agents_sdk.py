"""OpenAI's own browser SDK, ``@openai/agents-realtime`` (pinned in
tests/web/agents-sdk/package-lock.json, unpatched), against the real service:
its WebRTC transport pointed at our ``/v1/realtime/calls`` by its base URL,
from a page on another origin, with an ephemeral ``ek_`` secret our server
minted. A recorded question goes in through Chromium's fake microphone; the
SDK's history gets the transcript and the reply, the reply's audio reaches
the page, and nothing the SDK sends is refused."""

from __future__ import annotations

import asyncio
import logging
import shutil
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from playwright.async_api import Page, Playwright

from tests.conftest import ServerFactory
from tests.web.conftest import SiteFactory
from voice_agent.testing.audio_data import RATE, librivox, reference, silence, word_error_rate
from voice_agent.testing.browser import chromium, write_capture_wav

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("node") is None or shutil.which("npm") is None,
        reason="node and npm are needed for the @openai/agents-realtime test",
    ),
]

log = logging.getLogger(__name__)

SDK_DIR = Path(__file__).with_name("agents-sdk")
KEY = "sk-test-backend-0123"
QUESTION = "0930"
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."

# Records every event the SDK sends on the data channel (the SDK itself is
# untouched), so the test can say which ones it uses.
RECORD_SENT = """
(() => {
  window.sent = [];
  const send = RTCDataChannel.prototype.send;
  RTCDataChannel.prototype.send = function (data) {
    try { window.sent.push(JSON.parse(data)); } catch { window.sent.push({ type: null }); }
    return send.call(this, data);
  };
})();
"""

# The SDK's documented browser set-up, with its base URL changed to ours.
CONNECT = """
async ([bundle, callsUrl, secret, instructions]) => {
  const { OpenAIRealtimeWebRTC, RealtimeAgent, RealtimeSession } = await import(bundle);
  const seen = window.seen = { events: [], errors: [], history: [] };
  const transport = window.transport = new OpenAIRealtimeWebRTC({ baseUrl: callsUrl });
  const agent = new RealtimeAgent({ name: 'Assistant', instructions });
  const session = window.session = new RealtimeSession(agent, { transport });
  session.on('transport_event', (event) => seen.events.push(event));
  session.on('error', (event) => seen.errors.push(JSON.stringify(event.error)));
  session.on('history_updated', (history) => { seen.history = history; });
  await session.connect({ apiKey: secret });
  return transport.callId;
}
"""

INBOUND_ENERGY = """
async () => {
  const stats = await window.transport.connectionState.peerConnection.getStats();
  for (const s of stats.values()) {
    if (s.type === 'inbound-rtp' && s.kind === 'audio') return s.totalAudioEnergy ?? 0;
  }
  return null;
}
"""

# Both sides of the turn are in the SDK's history, finished (or an error came).
TURN_DONE = """
() => window.seen.errors.length > 0
  || window.seen.events.some((e) => e.type === 'error')
  || (['user', 'assistant'].every((role) => window.seen.history.some((item) =>
        item.type === 'message' && item.role === role && item.status === 'completed'
        && item.content.some((part) => part.transcript)))
      && window.seen.events.some((e) => e.type === 'output_audio_buffer.stopped'))
"""


async def bundle_sdk(out: Path) -> Path:
    """The pinned SDK bundled as one ES module by the pinned esbuild (offline)."""
    esbuild = SDK_DIR / "node_modules" / ".bin" / "esbuild"
    if not esbuild.exists():
        pytest.fail(f"the SDK is not installed: run `make agents-sdk` (npm ci in {SDK_DIR})")
    bundle = out / "agents-realtime.js"
    process = await asyncio.create_subprocess_exec(
        *(esbuild, "entry.js", "--bundle", "--format=esm", "--platform=browser"),
        *("--target=es2022", "--log-level=warning", f"--outfile={bundle}"),
        cwd=SDK_DIR,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        _, stderr = await process.communicate()
    assert process.returncode == 0, stderr.decode()
    return bundle


async def mint_secret(http: aiohttp.ClientSession, url: str) -> str:
    """What a customer's backend does: a client secret from its API key."""
    body = {"session": {"type": "realtime", "instructions": INSTRUCTIONS}}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with http.post(url + "/v1/realtime/client_secrets", json=body, headers=headers) as r:
        assert r.status == 200, await r.text()
        value = (await r.json())["value"]
    assert isinstance(value, str) and value.startswith("ek_")
    return value


async def inbound_energy(page: Page) -> float:
    energy = await page.evaluate(INBOUND_ENERGY)
    assert energy is not None, "no inbound audio stream"
    return float(energy)


def texts(history: list[dict[str, Any]], role: str) -> list[str]:
    return [
        part["transcript"]
        for item in history
        if item.get("type") == "message" and item.get("role") == role
        for part in item["content"]
        if part.get("transcript")
    ]


async def test_openais_agents_sdk_holds_a_spoken_conversation_cross_origin(
    playwright: Playwright,
    server_factory: ServerFactory,
    site_factory: SiteFactory,
    http: aiohttp.ClientSession,
    tmp_path: Path,
) -> None:
    bundle = await bundle_sdk(tmp_path)
    site = await site_factory(
        "<!doctype html><link rel=icon href=data:,><title>customer app</title>",
        {"/agents-realtime.js": bundle},
    )
    server = await server_factory(auth="required", api_keys=[KEY], cors_origins=[site])
    secret = await mint_secret(http, server.url)

    samples = np.concatenate((silence(3.0), librivox(QUESTION), silence(60.0)))
    wav = write_capture_wav(tmp_path / "question.wav", samples, RATE)
    async with chromium(playwright, capture_wav=wav) as browser:
        page = await browser.new_page()
        console: list[str] = []
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        await page.add_init_script(RECORD_SENT)
        await page.goto(site + "/")
        call_id = await page.evaluate(
            CONNECT,
            [site + "/agents-realtime.js", server.url + "/v1/realtime/calls", secret, INSTRUCTIONS],
        )
        # The SDK read the call's id from the answer's Location header (exposed to CORS).
        (call,) = server.calls.calls()
        assert call_id == call.id
        # Its session.update reached the session before connect() resolved.
        assert call.session.conversation.instructions == INSTRUCTIONS
        silent = await inbound_energy(page)

        await page.wait_for_function(TURN_DONE, timeout=90_000)
        seen = await page.evaluate("window.seen")
        sent = await page.evaluate("window.sent")
        log.info("the SDK sent %s", [event["type"] for event in sent])
        refused = [e for e in seen["events"] if e["type"] == "error"]
        assert refused == [] and seen["errors"] == [], (refused, seen["errors"], sent)
        # It asks for the transcribed item again, and gets it.
        asked = {e["item_id"] for e in sent if e["type"] == "conversation.item.retrieve"}
        retrieved = {
            e["item"]["id"] for e in seen["events"] if e["type"] == "conversation.item.retrieved"
        }
        assert asked and asked <= retrieved, (asked, retrieved)

        (heard,) = texts(seen["history"], "user")
        assert word_error_rate(reference(QUESTION), heard) <= 0.3, heard
        (reply,) = texts(seen["history"], "assistant")
        assert reply.strip()
        types = {e["type"] for e in seen["events"]}
        assert {
            "session.created",
            "session.updated",
            "conversation.item.input_audio_transcription.completed",
            "response.output_audio_transcript.delta",
            "response.done",
            "output_audio_buffer.started",
        } <= types, types
        # The reply's audio reached the page: energy well above the silence.
        assert await inbound_energy(page) - silent > 0.01

        # Closing the SDK's session releases the call on the server.
        await page.evaluate("window.session.close()")
        await asyncio.wait_for(server.calls.wait_for_count(0), 10)
    assert not [line for line in console if line.startswith("error")], console
