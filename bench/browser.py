"""Latency as a browser sees it: the demo page in headless Chromium.

Starts ``voice-agent serve`` (embedded models), opens the demo page in the
system Chromium with recorded questions as its fake microphone, and for each
turn prints the server's voice-to-voice span, the SDK's client-side figure
(`speech_stopped` arriving to `output_audio_buffer.started` arriving) and
the time until the reply is audible in the browser (inbound `audioLevel`
sampled every 10 ms), plus how long `connect()` took.

    .venv/bin/python bench/browser.py              # 5 turns
    .venv/bin/python bench/browser.py --turns 10
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from playwright.async_api import async_playwright

from voice_agent.testing.audio_data import RATE, silence
from voice_agent.testing.browser import chromium, write_capture_wav
from voice_agent.testing.figures import percentile, table
from voice_agent.testing.serving import start_server, wait_ready

# ``python bench/<script>.py`` puts bench/ on the path, not the checkout's
# root, which the bench.* imports below are found from.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.latency import CLIPS, speech_and_tail

GAP_S = 8.0  # silence after each question: room for the answer

# Per turn: when the end of the user's turn was announced and when the reply
# first became audible here (inbound audioLevel sampled every 10 ms).
PROBE = """
() => {
  const agent = window.voiceAgent.agent;
  window.benchTurns = [];
  let pending = null;
  agent.on('speechstop', () => { pending = { stoppedAt: performance.now() }; });
  agent.on('latency', ({ server, clientMs }) => {
    window.benchTurns.push({ server: server ?? {}, clientMs, audibleMs: pending?.audibleMs });
    pending = null;
  });
  setInterval(async () => {
    if (!pending || pending.audibleMs !== undefined || !agent.pc) return;
    for (const s of (await agent.pc.getStats()).values()) {
      if (s.type === 'inbound-rtp' && s.kind === 'audio' && (s.audioLevel ?? 0) > 0.01) {
        pending.audibleMs = Math.round(performance.now() - pending.stoppedAt);
      }
    }
  }, 10);
}
"""


def capture(turns: int, path: Path) -> Path:
    parts = [silence(1.0)]
    for turn in range(turns):
        speech, _ = speech_and_tail(CLIPS[turn % len(CLIPS)])
        parts += [speech, silence(GAP_S)]
    parts.append(silence(60.0))  # Chromium loops the file: don't ask again
    return write_capture_wav(path, np.concatenate(parts), RATE)


async def run(url: str, turns: int, wav: Path) -> tuple[float, list[dict[str, Any]]]:
    async with async_playwright() as driver, chromium(driver, capture_wav=wav) as browser:
        page = await browser.new_page()
        await page.goto(url + "/")
        started = await page.evaluate("performance.now()")
        await page.click("#connect")
        await page.wait_for_function("window.voiceAgent.state === 'listening'", timeout=30_000)
        connect_ms = float(await page.evaluate("performance.now()")) - float(started)
        await page.evaluate(PROBE)
        await page.wait_for_function(
            f"window.benchTurns.length >= {turns}", timeout=(turns * (GAP_S + 10) + 30) * 1000
        )
        results: list[dict[str, Any]] = await page.evaluate("window.benchTurns")
        await page.click("#connect")
        return connect_ms, results


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--turns", type=int, default=5, help="questions asked")
    args = parser.parse_args()

    server, url = await start_server()
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url)
        with tempfile.TemporaryDirectory() as tmp:
            wav = capture(args.turns, Path(tmp) / "questions.wav")
            connect_ms, turns = await run(url, args.turns, wav)
    finally:
        server.terminate()
        await server.wait()

    rows = []
    columns: dict[str, list[float]] = {"server": [], "client": [], "audible": []}
    for index, turn in enumerate(turns, 1):
        server_ms = turn["server"].get("voiceToVoiceMs")
        values = {
            "server": server_ms,
            "client": turn.get("clientMs"),
            "audible": turn.get("audibleMs"),
        }
        for key, value in values.items():
            if value is not None:
                columns[key].append(float(value))
        rows.append([index, *(fmt(values[k]) for k in ("server", "client", "audible"))])
    print(
        f"\n## demo page in headless Chromium, {len(turns)} turns; connect() {connect_ms:.0f} ms\n"
    )
    print(
        table(
            rows,
            ["turn", "server voice-to-voice", "client: turn end -> audio start", "audible here"],
        )
    )
    summary = [
        [name, fmt(statistics.median(v) if v else None), fmt(percentile(v, 95) if v else None)]
        for name, v in columns.items()
    ]
    print("\n" + table(summary, ["ms", "p50", "p95"]))


if __name__ == "__main__":
    asyncio.run(main())
