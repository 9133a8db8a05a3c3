"""``GET /metrics``: Prometheus exposition of a real server's real turns
(over the fake models and the scripted LLM: what is counted is the
server's), and the embedded LLM's gauges (over the real engine)."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RunningServer, ServerFactory
from tests.test_websocket import events_until, typed_turn, ws_url

KEY = "sk-metrics-test-0123"


async def scrape(http: aiohttp.ClientSession, server: RunningServer) -> dict[str, float]:
    """Every sample as 'name{label=value,...}' -> value."""
    headers = {"Authorization": f"Bearer {KEY}"}
    async with http.get(server.url + "/metrics", headers=headers) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


async def test_a_turn_shows_in_the_metrics(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(auth="required", api_keys=[KEY])
    before = await scrape(http, server)
    async with http.ws_connect(ws_url(server), headers={"Authorization": f"Bearer {KEY}"}) as ws:
        await events_until(ws, "session.created", 10)
        during = await scrape(http, server)
        assert during["voice_agent_active_calls{}"] == 1
        for event in typed_turn("Hello there!"):
            await ws.send_json(event)
        done = (await events_until(ws, "response.done"))[-1]
        assert done["response"]["status"] == "completed"
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    with pytest.raises(aiohttp.WSServerHandshakeError):
        await http.ws_connect(ws_url(server))  # no key: refused, and counted
    after = await scrape(http, server)

    def grew(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert grew("voice_agent_responses_total{reason=,status=completed}") == 1
    for stage in ("llm_ttft", "tts_first_audio"):
        assert grew(f"voice_agent_turn_latency_seconds_count{{stage={stage}}}") == 1
        assert grew(f"voice_agent_turn_latency_seconds_sum{{stage={stage}}}") > 0
    assert after["voice_agent_active_calls{}"] == 0
    assert grew("voice_agent_calls_ended_total{outcome=hangup}") == 1
    assert grew("voice_agent_calls_refused_total{reason=unauthorized}") == 1
    assert after["voice_agent_outbound_frames_total{}"] > 0
    # A remote LLM endpoint (the scripted one): no embedded server to report on.
    assert "voice_agent_llm_ready{}" not in after
    assert 0 <= after["voice_agent_event_loop_lag_seconds{quantile=0.99}"] < 5
    assert "voice_agent_event_loop_stalls_total{}" in after
    assert after["process_resident_memory_bytes{}"] > 50e6


@pytest.mark.e2e
async def test_the_embedded_llm_shows_in_the_metrics(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(auth="required", api_keys=[KEY])
    samples = await scrape(http, server)
    assert samples["voice_agent_llm_ready{}"] == 1
    assert "voice_agent_llm_restarts_total{}" in samples
