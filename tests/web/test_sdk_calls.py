"""The SDK against the real service from real Chromium: serving and CORS, a
page on another origin making a call, session updates, reconnection, and
every way connecting can fail, each with a readable error and nothing left
behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
from aiohttp import web
from playwright.async_api import Browser, Page, Playwright, Route

from tests.conftest import ServerFactory
from tests.web.conftest import SiteFactory
from voice_agent.client import RealtimeClient
from voice_agent.testing.audio_data import RATE, librivox, silence
from voice_agent.testing.browser import chromium, write_capture_wav
from voice_agent.testing.ports import free_port

pytestmark = [pytest.mark.e2e, pytest.mark.browser]

# Keeps every microphone stream the page opens, to check they are stopped.
TRACK_STREAMS = """
(() => {
  window.__streams = [];
  const open = navigator.mediaDevices.getUserMedia.bind(navigator.mediaDevices);
  navigator.mediaDevices.getUserMedia = async (constraints) => {
    const stream = await open(constraints);
    window.__streams.push(stream);
    return stream;
  };
})();
"""
LIVE_TRACKS = (
    "window.__streams.flatMap((s) => s.getTracks()).filter((t) => t.readyState === 'live').length"
)

# Connects with the SDK and reports the outcome without throwing.
CONNECT = """
async ([sdkUrl, options]) => {
  const sdk = await import(sdkUrl);
  const agent = window.agent = new sdk.VoiceAgent(options);
  window.seen = [];
  for (const type of ['state', 'error', 'reconnecting']) {
    agent.on(type, (e) => window.seen.push([type, e.state ?? e.code ?? e.attempt]));
  }
  try {
    await agent.connect();
    return { ok: true, state: agent.state };
  } catch (e) {
    return { ok: false, name: e.name, code: e.code, message: e.message,
             retryAfter: e.retryAfter ?? null, status: e.status ?? null, state: agent.state,
             pc: agent.pc };
  }
}
"""


@pytest_asyncio.fixture
async def browser(playwright: Playwright) -> AsyncIterator[Browser]:
    async with chromium(playwright) as launched:
        yield launched


async def new_page(browser: Browser, url: str) -> tuple[Page, list[str]]:
    """A page at ``url`` and the errors its console will log."""
    page = await browser.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    await page.add_init_script(TRACK_STREAMS)
    await page.goto(url)
    return page, errors


async def test_the_sdk_is_served_as_a_module_with_cors(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(cors_origins=["https://app.example"])
    origin = {"Origin": "https://app.example"}
    async with http.get(server.url + "/sdk/voice-agent.js", headers=origin) as response:
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/javascript; charset=utf-8"
        assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert "export async function connect" in await response.text()
    # The modules it imports, beside it: each served as a module to the same origins.
    for name in ("voice-agent-events.js", "voice-agent-media.js", "voice-agent-errors.js"):
        async with http.get(f"{server.url}/sdk/{name}", headers=origin) as response:
            assert response.status == 200, name
            assert response.headers["Content-Type"] == "text/javascript; charset=utf-8"
            assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"
            assert "export " in await response.text()
    async with http.get(server.url + "/sdk/voice-agent.d.ts") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("application/typescript")
        assert "export declare function connect" in await response.text()
    async with http.get(
        server.url + "/sdk/voice-agent.js", headers={"Origin": "https://evil.example"}
    ) as response:
        assert "Access-Control-Allow-Origin" not in response.headers
    preflight = {
        **origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    async with http.options(server.url + "/v1/realtime/calls", headers=preflight) as response:
        assert response.status == 204
        assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"


# A cross-origin POST with the headers OpenAI's SDKs add: the browser sends
# a preflight first, and fails the fetch if the server does not allow them.
FETCH_WITH_SDK_HEADERS = """
async (url) => {
  try {
    const response = await fetch(url, { method: 'POST', body: 'not sdp', headers: {
      'Content-Type': 'application/sdp', 'Authorization': 'Bearer ek_test',
      'X-OpenAI-Agents-SDK': 'openai-agents-sdk.realtime', 'OpenAI-Beta': 'realtime=v1',
      'X-Stainless-Lang': 'js', 'X-Stainless-Runtime': 'browser:chrome' } });
    return { status: response.status, body: await response.json() };
  } catch (e) {
    return { error: e.name };
  }
}
"""


async def test_a_browser_on_an_allowed_origin_may_send_openai_sdk_headers(
    browser: Browser, server_factory: ServerFactory, site_factory: SiteFactory
) -> None:
    allowed = await site_factory("<!doctype html><title>allowed</title>")
    other = await site_factory("<!doctype html><title>other</title>")
    server = await server_factory(cors_origins=[allowed])
    page, _ = await new_page(browser, allowed + "/")
    result = await page.evaluate(FETCH_WITH_SDK_HEADERS, server.url + "/v1/realtime/calls")
    # Through the preflight, and the server's own answer is readable.
    assert result["status"] == 400 and result["body"]["error"]["code"] == "invalid_sdp", result
    page, _ = await new_page(browser, other + "/")
    result = await page.evaluate(FETCH_WITH_SDK_HEADERS, server.url + "/v1/realtime/calls")
    assert result == {"error": "TypeError"}  # "Failed to fetch": refused at the preflight


async def test_a_page_on_another_origin_calls_and_hangs_up(
    browser: Browser, server_factory: ServerFactory, site_factory: SiteFactory
) -> None:
    site = await site_factory(
        "<!doctype html><link rel=icon href=data:,><title>customer app</title>"
    )
    server = await server_factory(cors_origins=[site])
    page, console_errors = await new_page(browser, site + "/")
    sdk = server.url + "/sdk/voice-agent.js"
    result = await page.evaluate(CONNECT, [sdk, {"url": server.url, "token": "sk-test"}])
    assert result == {"ok": True, "state": "listening"}
    assert len(server.calls) == 1
    assert await page.evaluate("window.seen") == [["state", "connecting"], ["state", "listening"]]

    # Session updates round-trip through the server.
    session = await page.evaluate(
        """() => window.agent.updateSession({ instructions: 'Answer in French.',
             turnDetection: { silenceDurationMs: 800 } })"""
    )
    assert session["instructions"] == "Answer in French."
    assert session["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 800
    refused = await page.evaluate(
        """() => window.agent.updateSession({ turnDetection: { silenceDurationMs: 5 } })
             .then(() => 'accepted', (e) => e.code)"""
    )
    assert refused == "invalid_value"
    # The server's voices, read from this origin; one is chosen, another it lacks refused.
    voices = await page.evaluate("window.agent.voices()")
    assert voices == [{"name": "joe", "backend": "piper", "default": True, "sample_rate": 22050}]
    chosen = await page.evaluate("window.agent.updateSession({ voice: 'joe' })")
    assert chosen["audio"]["output"]["voice"] == "joe"
    unknown = await page.evaluate(
        """() => window.agent.updateSession({ voice: 'alloy' }).then(() => 'accepted',
             (e) => [e.code, e.message])"""
    )
    assert unknown[0] == "invalid_value" and "'joe'" in unknown[1], unknown
    levels = await page.evaluate("window.agent.getLevels()")
    assert set(levels) == {"input", "output"}

    # Muting stops sending sound but keeps the track.
    await page.evaluate("window.agent.mute()")
    assert await page.evaluate("window.agent.microphone.getAudioTracks()[0].enabled") is False
    await page.evaluate("window.agent.unmute()")
    assert await page.evaluate("window.agent.microphone.getAudioTracks()[0].enabled") is True

    # Hanging up releases the microphone, the peer and the server's call.
    await page.evaluate("window.pc = window.agent.pc; window.agent.disconnect()")
    assert await page.evaluate(LIVE_TRACKS) == 0
    # The peer closes once the server has acknowledged the hang-up.
    await page.wait_for_function("window.pc.connectionState === 'closed'", timeout=5_000)
    assert await page.evaluate("window.agent.state") == "disconnected"
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)
    assert console_errors == []


async def test_an_origin_off_the_allow_list_cannot_load_the_sdk(
    browser: Browser, server_factory: ServerFactory, site_factory: SiteFactory
) -> None:
    allowed = await site_factory("<!doctype html><title>allowed</title>")
    other = await site_factory("<!doctype html><title>other</title>")
    server = await server_factory(cors_origins=[allowed])
    page, _ = await new_page(browser, other + "/")
    outcome = await page.evaluate(
        "(url) => import(url).then(() => 'loaded', (e) => e.name)",
        server.url + "/sdk/voice-agent.js",
    )
    assert outcome == "TypeError"
    assert len(server.calls) == 0


async def test_a_denied_microphone_is_a_clear_error(
    playwright: Playwright, server_factory: ServerFactory
) -> None:
    server = await server_factory()
    # No fake UI: the permission prompt is answered by the context, which grants nothing.
    async with chromium(playwright, fake_ui=False) as browser:
        context = await browser.new_context(permissions=[])
        page = await context.new_page()
        await page.goto(server.url + "/")
        await page.click("#connect")
        error = page.locator("#error")
        await error.wait_for(state="visible", timeout=10_000)
        assert await error.get_attribute("data-code") == "microphone_denied"
        assert "Microphone access was denied" in (await error.text_content() or "")
        assert await page.text_content("#status") == "disconnected"
        assert await page.text_content("#connect") == "Connect"
    assert len(server.calls) == 0


async def test_a_full_server_is_a_clear_error_with_retry_after(
    browser: Browser, server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(max_calls=1)
    holder = RealtimeClient(server.url)
    await holder.connect(http)
    page, _ = await new_page(browser, server.url + "/")
    result = await page.evaluate(CONNECT, ["/sdk/voice-agent.js", {}])
    assert result["ok"] is False
    assert result["code"] == "server_full" and result["status"] == 503
    assert result["retryAfter"] == 5
    assert "The server is full" in result["message"] and "5 s" in result["message"]
    assert result["state"] == "disconnected" and result["pc"] is None
    assert await page.evaluate(LIVE_TRACKS) == 0

    # The demo page shows it readably.
    await page.click("#connect")
    error = page.locator("#error")
    await error.wait_for(state="visible", timeout=10_000)
    assert await error.get_attribute("data-code") == "server_full"
    assert len(server.calls) == 1
    await holder.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


async def test_a_page_on_another_origin_reads_retry_after(
    browser: Browser,
    server_factory: ServerFactory,
    site_factory: SiteFactory,
    http: aiohttp.ClientSession,
) -> None:
    site = await site_factory("<!doctype html><link rel=icon href=data:,><title>app</title>")
    server = await server_factory(max_calls=1, cors_origins=[site])
    holder = RealtimeClient(server.url)
    await holder.connect(http)
    page, _ = await new_page(browser, site + "/")
    sdk = server.url + "/sdk/voice-agent.js"
    result = await page.evaluate(CONNECT, [sdk, {"url": server.url}])
    assert result["code"] == "server_full" and result["retryAfter"] == 5, result
    await holder.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


@pytest.mark.slow
async def test_a_full_server_is_retried_when_reconnect_is_on(
    browser: Browser, server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(max_calls=1)
    holder = RealtimeClient(server.url)
    await holder.connect(http)
    page, _ = await new_page(browser, server.url + "/")
    attempt = asyncio.ensure_future(
        page.evaluate(CONNECT, ["/sdk/voice-agent.js", {"reconnect": {"attempts": 3}}])
    )
    await page.wait_for_function(
        "window.seen?.some(([type]) => type === 'reconnecting')", timeout=10_000
    )
    await holder.hangup(http)  # a slot frees up before the Retry-After pause ends
    result: dict[str, Any] = await asyncio.wait_for(attempt, 30)
    assert result == {"ok": True, "state": "listening"}
    await page.evaluate("window.agent.disconnect()")
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


async def test_an_unreachable_server_is_a_clear_error(
    browser: Browser, server_factory: ServerFactory
) -> None:
    server = await server_factory()  # serves the SDK; the call goes elsewhere
    page, _ = await new_page(browser, server.url + "/")
    nowhere = f"http://127.0.0.1:{free_port()}"
    result = await page.evaluate(CONNECT, ["/sdk/voice-agent.js", {"url": nowhere}])
    assert result["ok"] is False and result["code"] == "server_unreachable"
    assert nowhere in result["message"]
    assert result["state"] == "disconnected" and result["pc"] is None
    assert await page.evaluate(LIVE_TRACKS) == 0
    assert await page.evaluate("window.seen") == [
        ["state", "connecting"],
        ["error", "server_unreachable"],
        ["state", "disconnected"],
    ]


async def test_a_call_dropped_by_the_server_reconnects(
    browser: Browser, server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory()
    page, console_errors = await new_page(browser, server.url + "/")
    result = await page.evaluate(CONNECT, ["/sdk/voice-agent.js", {"reconnect": True}])
    assert result["ok"] is True
    (first,) = server.calls.calls()
    await first.close("server_restart")
    await page.wait_for_function(
        "window.seen.filter(([t, s]) => t === 'state' && s === 'listening').length === 2",
        timeout=30_000,
    )
    (second,) = server.calls.calls()
    assert second.id != first.id
    seen = await page.evaluate("window.seen")
    assert ["error", "call_ended"] in seen and ["reconnecting", 1] in seen
    assert await page.evaluate(LIVE_TRACKS) == 1  # the old microphone was released
    await page.evaluate("window.agent.disconnect()")
    assert await page.evaluate(LIVE_TRACKS) == 0
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)
    assert console_errors == []


# Closes the SDK's data channel as soon as the answer is applied: the channel
# ends while the call is still connecting.
CLOSE_CHANNEL_WHILE_CONNECTING = """
(() => {
  const create = RTCPeerConnection.prototype.createDataChannel;
  RTCPeerConnection.prototype.createDataChannel = function (...args) {
    return (window.__channel = create.apply(this, args));
  };
  const apply = RTCPeerConnection.prototype.setRemoteDescription;
  RTCPeerConnection.prototype.setRemoteDescription = async function (...args) {
    const result = await apply.apply(this, args);
    window.__channel.close();
    return result;
  };
})();
"""


async def test_a_channel_closed_while_connecting_fails_the_connect_at_once(
    browser: Browser, server_factory: ServerFactory
) -> None:
    server = await server_factory()
    page = await browser.new_page()
    await page.add_init_script(TRACK_STREAMS)
    await page.add_init_script(CLOSE_CHANNEL_WHILE_CONNECTING)
    await page.goto(server.url + "/")
    # Far below the 30 s connect timeout the old behaviour waited for.
    result = await asyncio.wait_for(
        page.evaluate(CONNECT, ["/sdk/voice-agent.js", {"connectTimeoutMs": 30_000}]), 15
    )
    assert result["ok"] is False and result["code"] == "call_ended", result
    assert result["state"] == "disconnected" and result["pc"] is None
    errors = [s for t, s in await page.evaluate("window.seen") if t == "error"]
    assert errors == ["call_ended"]  # reported once, by the failed connect
    assert await page.evaluate(LIVE_TRACKS) == 0
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


@pytest.mark.slow
async def test_an_ice_failure_is_reported_and_released(
    browser: Browser, server_factory: ServerFactory
) -> None:
    server = await server_factory()
    page, _ = await new_page(browser, server.url + "/")

    def without_candidates(sdp: str) -> str:
        return "".join(
            line for line in sdp.splitlines(keepends=True) if not line.startswith("a=candidate")
        )

    async def unreachable_candidates(route: Route) -> None:
        # The real server, reached with every ICE candidate taken out of the
        # offer and the answer: signaling succeeds, no media path exists.
        offer = without_candidates(route.request.post_data or "")
        response = await route.fetch(post_data=offer)
        await route.fulfill(response=response, body=without_candidates(await response.text()))

    await page.route("**/v1/realtime/calls", unreachable_candidates)
    result = await page.evaluate(CONNECT, ["/sdk/voice-agent.js", {"connectTimeoutMs": 3000}])
    assert result["ok"] is False and result["code"] == "ice_failed", result
    assert result["state"] == "disconnected" and result["pc"] is None
    assert await page.evaluate(LIVE_TRACKS) == 0
    # The SDK hung up the half-made call rather than leaving it to time out.
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


@pytest.mark.slow
async def test_interrupt_cancels_the_reply_and_cuts_its_audio(
    playwright: Playwright, server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = await server_factory(llm_max_tokens=120)
    question = np.concatenate((silence(3.0), librivox("0880"), silence(60.0)))
    wav = write_capture_wav(tmp_path / "question.wav", question, RATE)
    async with chromium(playwright, capture_wav=wav) as browser:
        page, console_errors = await new_page(browser, server.url + "/")
        result = await page.evaluate(CONNECT, ["/sdk/voice-agent.js", {}])
        assert result["ok"] is True
        await page.evaluate(
            """() => window.agent.updateSession({ instructions:
                 'Answer with a long, detailed story of at least five sentences.' })"""
        )
        await page.wait_for_function("window.agent.state === 'speaking'", timeout=60_000)
        done = await page.evaluate(
            """() => new Promise((resolve) => {
                 window.agent.on('assistantdone', resolve);
                 window.agent.interrupt();
               })"""
        )
        assert done["status"] == "cancelled" and done["reason"] == "client_cancelled"
        assert await page.evaluate("window.agent.state") == "listening"
        kinds = [e["type"] for e in await page.evaluate("window.agent.events")]
        assert "output_audio_buffer.cleared" in kinds
        assert not [e for e in await page.evaluate("window.agent.events") if e["type"] == "error"]
        await page.evaluate("window.agent.disconnect()")
        assert console_errors == []
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


async def test_a_server_that_never_answers_times_out_and_the_offer_is_aborted(
    browser: Browser, server_factory: ServerFactory
) -> None:
    server = await server_factory()  # serves the SDK
    arrived = asyncio.Event()
    aborted = asyncio.Event()

    async def hang(request: web.Request) -> web.StreamResponse:
        arrived.set()
        try:
            await asyncio.Event().wait()  # never answers
        except asyncio.CancelledError:  # aiohttp cancels the handler when the client aborts
            aborted.set()
            raise
        raise AssertionError("unreachable")

    async def preflight(request: web.Request) -> web.StreamResponse:
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Origin": "*",
                "Access-Control-Allow-Methods": "POST",
                "Access-Control-Allow-Headers": "content-type",
            },
        )

    app = web.Application()
    app.router.add_post("/v1/realtime/calls", hang)
    app.router.add_route("OPTIONS", "/v1/realtime/calls", preflight)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        page, _ = await new_page(browser, server.url + "/")
        result = await page.evaluate(
            CONNECT,
            ["/sdk/voice-agent.js", {"url": f"http://127.0.0.1:{port}", "connectTimeoutMs": 2000}],
        )
        assert arrived.is_set()
        assert result["ok"] is False and result["code"] == "timeout", result
        assert result["message"] == "The server did not answer within 2 s."
        assert result["state"] == "disconnected" and result["pc"] is None
        assert await page.evaluate(LIVE_TRACKS) == 0
        await asyncio.wait_for(aborted.wait(), 5)
    finally:
        await runner.cleanup()


async def test_typed_text_gets_a_spoken_answer(
    playwright: Playwright, server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = await server_factory()
    # A silent microphone: nothing the VAD could take for a barge-in.
    wav = write_capture_wav(tmp_path / "silence.wav", silence(5.0), RATE)
    async with chromium(playwright, capture_wav=wav) as browser:
        page, console_errors = await new_page(browser, server.url + "/")
        result = await page.evaluate(CONNECT, ["/sdk/voice-agent.js", {}])
        assert result["ok"] is True
        done = await page.evaluate(
            """() => new Promise((resolve) => {
                 window.agent.on('assistantdone', resolve);
                 window.agent.sendText('Say hello to me, please.');
               })"""
        )
        assert done["status"] == "completed", done
        assert done["text"].strip(), done
        events = await page.evaluate("window.agent.events")
        kinds = [e["type"] for e in events]
        assert "error" not in kinds, [e for e in events if e["type"] == "error"]
        # The reply was spoken, not only written: its audio went out and stopped.
        assert kinds.index("output_audio_buffer.started") < kinds.index(
            "output_audio_buffer.stopped"
        )
        energy = await page.evaluate(
            """async () => {
                 let energy = 0;
                 (await window.agent.pc.getStats()).forEach((s) => {
                   if (s.type === 'inbound-rtp' && s.kind === 'audio') energy = s.totalAudioEnergy;
                 });
                 return energy;
               }"""
        )
        assert energy > 0
        await page.evaluate("window.agent.disconnect()")
        assert console_errors == []
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


@pytest.mark.slow
async def test_text_typed_during_a_reply_interrupts_it_and_is_answered(
    playwright: Playwright, server_factory: ServerFactory, tmp_path: Path
) -> None:
    """The server allows one active reply: sendText cancels it rather than be refused."""
    server = await server_factory(llm_max_tokens=120)
    wav = write_capture_wav(tmp_path / "silence.wav", silence(5.0), RATE)
    async with chromium(playwright, capture_wav=wav) as browser:
        page, console_errors = await new_page(browser, server.url + "/")
        result = await page.evaluate(CONNECT, ["/sdk/voice-agent.js", {}])
        assert result["ok"] is True
        await page.evaluate(
            """() => {
                 window.done = [];
                 window.agent.on('assistantdone', (d) => window.done.push(d));
                 window.agent.sendText('Tell me a long story of at least five sentences.');
               }"""
        )
        await page.wait_for_function("window.agent.state === 'speaking'", timeout=60_000)
        await page.evaluate("window.agent.sendText('Now just say hello.')")
        await page.wait_for_function("window.done.length === 2", timeout=60_000)
        first, second = await page.evaluate("window.done")
        assert first["status"] == "cancelled", first
        assert second["status"] == "completed" and second["text"].strip(), second
        events = await page.evaluate("window.agent.events")
        assert [e for e in events if e["type"] == "error"] == []
        await page.evaluate("window.agent.disconnect()")
        assert console_errors == []
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)
