"""``GET /metrics``: Prometheus text exposition.

What happened (replies by outcome, per-stage latency histograms, errors by
code: ``observability.py``) is counted as it happens; the live state (calls,
outbound pacing, STT batch sizes, refusals, event-loop lag and stalls, the
embedded LLM's restarts) is
read from the application at scrape time; ``process_*`` is
prometheus-client's own (CPU seconds, resident memory). With ``--workers``
the front scrapes each worker on its socket and merges every family into
one exposition, each sample labelled ``process="front"`` or
``process="worker-N"``: sum the workers' samples in queries, except
``voice_agent_active_calls``, whose front sample is already the total
over its workers (the one to scale on).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4"
SCRAPE_TIMEOUT_S = 2.0


class LiveState:
    """What /metrics reads from the application when scraped."""

    def __init__(
        self,
        calls: Callable[[], int],
        ended: Callable[[], dict[str, int]],
        refused: Callable[[], dict[str, int]],
        pacing: Callable[[], dict[str, Any] | None],
        stt: Callable[[], dict[str, Any]],
        llm: Callable[[], dict[str, Any] | None],
        loop: Callable[[], dict[str, Any]],
    ) -> None:
        self.calls, self.ended, self.refused = calls, ended, refused
        self.pacing, self.stt, self.llm, self.loop = pacing, stt, llm, loop


class LiveCollector(Collector):
    def __init__(self, state: LiveState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state
        yield GaugeMetricFamily("voice_agent_active_calls", "Calls live now.", state.calls())
        ended = CounterMetricFamily(
            "voice_agent_calls_ended", "Calls ended, by how.", labels=["outcome"]
        )
        for outcome, count in sorted(state.ended().items()):
            ended.add_metric([outcome], count)
        yield ended
        refused = CounterMetricFamily(
            "voice_agent_calls_refused", "Calls refused before they began.", labels=["reason"]
        )
        for reason, count in sorted(state.refused().items()):
            refused.add_metric([reason], count)
        yield refused
        pacing = state.pacing()
        if pacing is not None:
            yield CounterMetricFamily(
                "voice_agent_outbound_frames", "Outbound 20 ms frames sent.", pacing["frames"]
            )
            yield CounterMetricFamily(
                "voice_agent_outbound_frames_late",
                "Outbound frames sent more than 20 ms after their time.",
                pacing["late_over_20ms"],
            )
        batches = state.stt().get("batch_sizes")
        if isinstance(batches, dict):
            family = CounterMetricFamily(
                "voice_agent_stt_batches", "STT inferences, by batch size.", labels=["size"]
            )
            for size, count in batches.items():
                family.add_metric([str(size)], count)
            yield family
        yield from _hearing(state.stt().get("hearing"))
        loop = state.loop()
        lag = GaugeMetricFamily(
            "voice_agent_event_loop_lag_seconds",
            "How late the event loop ran a 100 ms heartbeat, over the last minute.",
            labels=["quantile"],
        )
        for quantile, key in (("0.5", "lag_p50_ms"), ("0.99", "lag_p99_ms"), ("1", "lag_max_ms")):
            lag.add_metric([quantile], loop[key] / 1000.0)
        yield lag
        yield CounterMetricFamily(
            "voice_agent_event_loop_stalls",
            "Times a callback blocked the event loop past --loop-stall-ms once started"
            " (stalls while the models load are counted apart, in /v1/stats).",
            loop["stalls"],
        )
        llm = state.llm()
        if llm is not None and llm.get("kind") == "embedded":
            yield CounterMetricFamily(
                "voice_agent_llm_restarts", "Restarts of the embedded LLM.", llm["restarts"]
            )
            yield GaugeMetricFamily(
                "voice_agent_llm_ready", "1 while the LLM answers.", float(bool(llm["ready"]))
            )


def _hearing(hearing: object) -> Iterator[Metric]:
    """Turns whose fast transcript was decoded again, and voiced turns with
    no words even then (the caller was asked to repeat)."""
    if not isinstance(hearing, dict):
        return
    for name, key, text in (
        ("voice_agent_stt_redecoded", "redecoded", "Transcripts decoded again the safe way."),
        ("voice_agent_turns_unheard", "unheard", "Voiced turns with no words recognised."),
    ):
        family = CounterMetricFamily(name, text, labels=["reason"])
        for reason, count in sorted(hearing.get(key, {}).items()):
            family.add_metric([reason], count)
        yield family


def render(state: LiveState) -> bytes:
    """This process's exposition: the counted metrics, then the live state."""
    live = CollectorRegistry(auto_describe=False)
    live.register(LiveCollector(state))
    return generate_latest(REGISTRY) + generate_latest(live)


class _Merged(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self._families


def merge(expositions: dict[str, str]) -> bytes:
    """Several processes' expositions as one, each sample labelled with
    the process it came from."""
    merged: dict[str, Metric] = {}
    for process, text in expositions.items():
        for family in text_string_to_metric_families(text):
            target = merged.get(family.name)
            if target is None:
                target = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
            for sample in family.samples:
                labels = {**sample.labels, "process": process}
                target.add_sample(sample.name, labels, sample.value, sample.timestamp)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(merged.values()))
    return generate_latest(registry)


async def scrape(http: aiohttp.ClientSession, url: str) -> str | None:
    try:
        async with asyncio.timeout(SCRAPE_TIMEOUT_S):
            async with http.get(url) as response:
                return await response.text() if response.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


def metrics_response(body: bytes) -> web.Response:
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})
