"""SDK unit tests, run inside real Chromium: the module is imported from the
service and fed synthetic server events (OpenAI Realtime GA shapes)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from playwright.async_api import Page, Playwright

from tests.conftest import ServerFactory
from voice_agent.testing.browser import chromium

pytestmark = pytest.mark.browser


@pytest_asyncio.fixture
async def sdk_page(playwright: Playwright, server_factory: ServerFactory) -> AsyncIterator[Page]:
    server = await server_factory()
    async with chromium(playwright) as browser:
        page = await browser.new_page()
        await page.goto(server.url + "/")
        await page.evaluate("async () => { window.sdk = await import('/sdk/voice-agent.js'); }")
        yield page


# A whole voice turn as the server sends it, with the client's clock (ms)
# at which each event arrives.
TURN: list[tuple[int, dict[str, Any]]] = [
    (0, {"type": "session.created", "session": {"instructions": "be brief"}}),
    (
        1000,
        {"type": "input_audio_buffer.speech_started", "item_id": "item_u", "audio_start_ms": 900},
    ),
    (
        1200,
        {
            "type": "conversation.item.input_audio_transcription.delta",
            "item_id": "item_u",
            "content_index": 0,
            "delta": "what is",
        },
    ),
    (
        1400,
        {
            "type": "conversation.item.input_audio_transcription.delta",
            "item_id": "item_u",
            "content_index": 0,
            "delta": " the time",
        },
    ),
    (
        2000,
        {"type": "input_audio_buffer.speech_stopped", "item_id": "item_u", "audio_end_ms": 1900},
    ),
    (
        2100,
        {
            "type": "conversation.item.input_audio_transcription.completed",
            "item_id": "item_u",
            "content_index": 0,
            "transcript": " What is the time? ",
        },
    ),
    (2150, {"type": "response.created", "response": {"id": "resp_1", "status": "in_progress"}}),
    (
        2300,
        {
            "type": "response.output_audio_transcript.delta",
            "response_id": "resp_1",
            "item_id": "item_a",
            "delta": "It is",
        },
    ),
    (2450, {"type": "output_audio_buffer.started", "response_id": "resp_1"}),
    (
        2500,
        {
            "type": "response.output_audio_transcript.delta",
            "response_id": "resp_1",
            "item_id": "item_a",
            "delta": " noon.",
        },
    ),
    (4000, {"type": "output_audio_buffer.stopped", "response_id": "resp_1"}),
    # Sent once the reply has been played, so after its audio stopped.
    (
        4010,
        {
            "type": "response.done",
            "response": {
                "id": "resp_1",
                "status": "completed",
                "status_details": None,
                "output": [
                    {
                        "id": "item_a",
                        "content": [{"type": "output_audio", "transcript": "It is noon."}],
                    }
                ],
                "metadata": {
                    "voice_to_voice_ms": "612.5",
                    "stt_ms": "120.0",
                    "llm_ttft_ms": "200.1",
                    "tts_first_audio_ms": "90.0",
                    "speculative": "false",
                },
            },
        },
    ),
]

FEED = """
([steps, initial]) => {
  let clock = 0;
  const tracker = new window.sdk.EventTracker(() => clock, initial);
  const out = [];
  for (const [at, event] of steps) {
    clock = at;
    for (const [type, detail] of tracker.handle(event)) {
      out.push([type, detail instanceof Error
        ? { code: detail.code, message: detail.message, fatal: detail.fatal } : detail]);
    }
  }
  return { out, state: tracker.state };
}
"""


async def feed(
    page: Page, steps: list[tuple[int, dict[str, Any]]], initial: str = "connecting"
) -> tuple[list[tuple[str, Any]], str]:
    result = await page.evaluate(FEED, [steps, initial])
    return [(t, d) for t, d in result["out"]], result["state"]


async def test_a_voice_turn_becomes_typed_events_and_states(sdk_page: Page) -> None:
    out, state = await feed(sdk_page, TURN)
    states = [d["state"] for t, d in out if t == "state"]
    assert states == ["listening", "thinking", "speaking", "listening"]
    assert state == "listening"

    partials = [d["text"] for t, d in out if t == "userpartial"]
    assert partials == ["what is", "what is the time"]
    (final,) = [d for t, d in out if t == "usertranscript"]
    assert final == {"itemId": "item_u", "text": "What is the time?"}
    deltas = [d["text"] for t, d in out if t == "assistantdelta"]
    assert deltas == ["It is", "It is noon."]
    (done,) = [d for t, d in out if t == "assistantdone"]
    assert done["text"] == "It is noon." and done["status"] == "completed"
    assert done["itemId"] == "item_a"

    (latency,) = [d for t, d in out if t == "latency"]
    assert latency["server"]["voiceToVoiceMs"] == 612.5
    assert latency["server"]["sttMs"] == 120 and latency["server"]["llmTtftMs"] == 200.1
    # Client side: from the end-of-turn notice (2000) to the audio starting (2450).
    assert latency["clientMs"] == 450

    kinds = [t for t, _ in out]
    back_to_listening = max(i for i, (t, d) in enumerate(out) if t == "state")
    assert back_to_listening < kinds.index("assistantdone")
    assert kinds.index("speechstart") < kinds.index("speechstop") < kinds.index("usertranscript")
    assert kinds.index("assistantdone") < kinds.index("latency")


async def test_barge_in_returns_to_listening_and_keeps_what_was_heard(sdk_page: Page) -> None:
    steps = [
        *TURN[:9],  # the assistant has started speaking
        (
            2700,
            {
                "type": "input_audio_buffer.speech_started",
                "item_id": "item_u2",
                "audio_start_ms": 2600,
            },
        ),
        (2750, {"type": "output_audio_buffer.cleared", "response_id": "resp_1"}),
        (
            2760,
            {
                "type": "response.done",
                "response": {
                    "id": "resp_1",
                    "status": "cancelled",
                    "status_details": {"type": "cancelled", "reason": "turn_detected"},
                    "output": [{"id": "item_a", "content": [{"transcript": "It"}]}],
                    "metadata": None,
                },
            },
        ),
    ]
    out, state = await feed(sdk_page, steps)
    states = [d["state"] for t, d in out if t == "state"]
    assert states == ["listening", "thinking", "speaking", "listening"]
    assert state == "listening"
    (done,) = [d for t, d in out if t == "assistantdone"]
    assert done == {
        "responseId": "resp_1",
        "itemId": "item_a",
        "text": "It",
        "status": "cancelled",
        "reason": "turn_detected",
    }
    # No server spans, but the client still measured when the audio started.
    (latency,) = [d for t, d in out if t == "latency"]
    assert latency["clientMs"] == 450 and latency.get("server") is None


async def test_noise_without_words_hands_the_floor_back(sdk_page: Page) -> None:
    steps = [
        (0, {"type": "input_audio_buffer.speech_started", "item_id": "item_n"}),
        (500, {"type": "input_audio_buffer.speech_stopped", "item_id": "item_n"}),
        (
            600,
            {
                "type": "conversation.item.input_audio_transcription.completed",
                "item_id": "item_n",
                "transcript": "  ",
            },
        ),
    ]
    out, state = await feed(sdk_page, steps, "listening")
    assert [d["state"] for t, d in out if t == "state"] == ["thinking", "listening"]
    assert state == "listening"
    assert ("usertranscript", {"itemId": "item_n", "text": ""}) in out


async def test_a_reply_without_audio_and_a_failed_reply(sdk_page: Page) -> None:
    steps: list[tuple[int, dict[str, Any]]] = [
        (0, {"type": "input_audio_buffer.speech_stopped", "item_id": "item_u"}),
        (10, {"type": "response.created", "response": {"id": "resp_f"}}),
        (
            20,
            {
                "type": "response.done",
                "response": {
                    "id": "resp_f",
                    "status": "failed",
                    "status_details": {"type": "failed", "error": {"code": "llm_error"}},
                    "output": [],
                    "metadata": None,
                },
            },
        ),
    ]
    out, state = await feed(sdk_page, steps, "listening")
    assert state == "listening"
    errors = [d for t, d in out if t == "error"]
    assert errors and errors[0]["code"] == "llm_error"
    (done,) = [d for t, d in out if t == "assistantdone"]
    assert done["status"] == "failed" and done["reason"] == "llm_error"


async def test_server_error_events_become_errors(sdk_page: Page) -> None:
    event = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "code": "unknown_event",
            "message": "nope",
            "event_id": "e1",
        },
    }
    out, state = await feed(sdk_page, [(0, event)], "listening")
    assert out == [("error", {"code": "unknown_event", "message": "nope", "fatal": False})]
    assert state == "listening"


async def test_client_events_follow_the_realtime_schema(sdk_page: Page) -> None:
    update = await sdk_page.evaluate(
        """() => window.sdk.sessionUpdateEvent({instructions: 'Be terse.', voice: 'joe',
             turnDetection: {silenceDurationMs: 700}})"""
    )
    assert update["type"] == "session.update" and update["event_id"]
    assert update["session"] == {
        "type": "realtime",
        "instructions": "Be terse.",
        "audio": {
            "output": {"voice": "joe"},
            "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 700}},
        },
    }
    only = await sdk_page.evaluate("() => window.sdk.sessionUpdateEvent({instructions: 'x'})")
    assert only["session"] == {"type": "realtime", "instructions": "x"}

    text = await sdk_page.evaluate("() => window.sdk.userTextEvents('What time is it?')")
    assert [e["type"] for e in text] == ["conversation.item.create", "response.create"]
    assert text[0]["item"] == {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "What time is it?"}],
    }
    assert len({e["event_id"] for e in text}) == 2
    refused = await sdk_page.evaluate(
        "() => { try { window.sdk.userTextEvents('  '); } catch (e) { return e.code; } }"
    )
    assert refused == "invalid_text"


async def test_the_agent_dispatches_raw_messages_to_listeners(sdk_page: Page) -> None:
    received = await sdk_page.evaluate(
        """(events) => {
          const agent = new window.sdk.VoiceAgent({ url: location.origin });
          const seen = [];
          agent.on('event', (e) => seen.push(['event', e.type]));
          agent.on('state', (e) => seen.push(['state', e.state]));
          const off = agent.on('assistantdelta', (e) => seen.push(['delta', e.text]));
          agent.on('assistantdelta', () => { throw new Error('a broken listener'); });
          agent.receive('not json');
          for (const e of events) agent.receive(JSON.stringify(e));
          off();
          agent.receive(JSON.stringify(events[events.length - 1]));
          return { seen, state: agent.state, count: agent.events.length };
        }""",
        [
            {"type": "session.created", "session": {}},
            {"type": "response.output_audio_transcript.delta", "response_id": "r", "delta": "Hi"},
        ],
    )
    assert received["seen"] == [
        ["event", "session.created"],
        ["event", "response.output_audio_transcript.delta"],
        ["delta", "Hi"],
        ["event", "response.output_audio_transcript.delta"],
    ]
    # A fresh agent is disconnected; session.created only moves it on while connecting.
    assert received["state"] == "disconnected" and received["count"] == 3


@pytest.mark.parametrize("method", ["sendText('hi')", "interrupt()", "send({type: 'x'})"])
async def test_methods_need_a_connection(sdk_page: Page, method: str) -> None:
    code = await sdk_page.evaluate(
        f"""() => {{
          const agent = new window.sdk.VoiceAgent();
          agent.tracker.activeResponseId = 'r';  // so interrupt() has something to send
          try {{ agent.{method}; }} catch (e) {{ return e.code; }}
          return 'no error';
        }}"""
    )
    assert code == "not_connected"


async def test_the_served_types_declare_every_export(sdk_page: Page) -> None:
    exported = set(await sdk_page.evaluate("Object.keys(window.sdk)"))
    types = await sdk_page.evaluate("fetch('/sdk/voice-agent.d.ts').then((r) => r.text())")
    declared = set(re.findall(r"^export declare (?:const|class|function) (\w+)", types, re.M))
    assert exported == declared
