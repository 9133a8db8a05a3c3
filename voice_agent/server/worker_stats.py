"""The media workers' ``/v1/stats``, fetched from each worker and summed
into the one body the front answers (``--workers``): counters add up,
sessions are listed together, what is per worker stays per worker."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp

from voice_agent.server.worker_pool import Worker

WORKER_STATS_TIMEOUT_S = 2.0


async def worker_stats(worker: Worker) -> dict[str, Any] | None:
    """A worker's own ``/v1/stats``; None when it is down or does not answer in time."""
    if not worker.up or worker.http is None:
        return None
    try:
        async with asyncio.timeout(WORKER_STATS_TIMEOUT_S):
            async with worker.http.get(worker.base_url + "/v1/stats") as answer:
                body: dict[str, Any] = await answer.json()
                return body
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


def merge_pacing(parts: list[dict[str, Any]]) -> dict[str, Any]:
    counters = ("frames", "audio_frames", "late_over_20ms", "resyncs")
    merged: dict[str, Any] = {key: sum(p.get(key, 0) for p in parts) for key in counters}
    merged["max_late_ms"] = max((p.get("max_late_ms", 0.0) for p in parts), default=0.0)
    return merged


def merge_end_of_turn(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The workers' end-of-turn verdicts, summed (their times stay per worker)."""
    decisions: Counter[str] = Counter()
    for part in parts:
        decisions.update(part.get("decisions", {}))
    return {"decisions": dict(decisions)}


def merge_hearing(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The workers' redecoded and unheard turns, summed (sessions live there)."""
    merged: dict[str, Any] = {"redecoded": Counter(), "unheard": Counter(), "loops_cut": 0}
    for part in parts:
        merged["redecoded"].update(part.get("redecoded", {}))
        merged["unheard"].update(part.get("unheard", {}))
        merged["loops_cut"] += part.get("loops_cut", 0)
    return {**merged, "redecoded": dict(merged["redecoded"]), "unheard": dict(merged["unheard"])}


def merge_stt(own: dict[str, Any], answered: list[dict[str, Any]]) -> dict[str, Any]:
    """The front's STT backend counters (the model is the front's), with
    the workers' sessions, re-decoded turns and end-of-turn verdicts."""
    parts = [w.get("stt", {}) for w in answered]
    body = dict(own)
    body["sessions"] = [s for part in parts for s in part.get("sessions", [])]
    body["hearing"] = merge_hearing([part.get("hearing", {}) for part in parts])
    body["end_of_turn"] = merge_end_of_turn([part.get("end_of_turn", {}) for part in parts])
    return body


def add_worker_lines(
    statuses: list[dict[str, Any]], per_worker: list[dict[str, Any] | None]
) -> None:
    """Each worker's own pacing and event loop, on its status line."""
    for status, stats in zip(statuses, per_worker, strict=True):
        if stats is not None:
            status["pacing"] = stats.get("pacing")
            if "loop" in stats:
                status["loop"] = stats["loop"]
