"""Speaking over the agent's reply, and hearing when that reply stopped:
what bench/turn_taking.py and bench/ws_interrupt.py measure false
barge-ins (a cough, a filler) and real interruptions with."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import numpy as np

from bench.turn_material import RATE
from voice_agent.client import RealtimeClient
from voice_agent.testing.audio_data import silence, speech_bounds

LONG_REPLY = "Count slowly from one to thirty, one number a sentence."
# A reply's own sound resumes within this of the onset (a gap between its
# sentences); the answer to the interruption comes seconds later.
FIRST_GAP_S = 0.5
SOUNDING_PEAK = 500  # int16: received audio louder than this is the reply sounding


def long_reply_request() -> list[dict[str, Any]]:
    """The client events that ask for a long reply (LONG_REPLY, typed)."""
    item = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": LONG_REPLY}],
    }
    return [{"type": "conversation.item.create", "item": item}, {"type": "response.create"}]


async def over_a_reply(
    client: RealtimeClient, burst: np.ndarray
) -> tuple[dict[str, Any], float, bool]:
    """Speak ``burst`` 0.8 s into a long reply: the reply's response, the
    time the burst's speech began (monotonic), and whether the reply was
    still going then (a short one may be over before the burst)."""
    mark = len(client.events)
    for event in long_reply_request():
        client.send(event)
    started = await asyncio.wait_for(
        client.wait_for_type("output_audio_buffer.started", after=mark), 30
    )
    done = client.wait_for(
        lambda e: e["type"] == "response.done" and e["response"]["id"] == started["response_id"],
        after=mark,
    )
    await asyncio.sleep(0.8)
    lead = silence(0.1)
    onset = await client.mic.play(lead, RATE) + speech_bounds(burst)[0]
    client.mic.play(np.concatenate((burst, silence(1.0))), RATE)
    response = (await asyncio.wait_for(done, 60))["response"]
    await asyncio.sleep(1.0)
    sounding = client.received.peak_between(onset - 0.3, onset) > SOUNDING_PEAK
    return response, onset, sounding


def last_sound(
    sounds: Iterable[tuple[float, int]], onset: float, lead_s: float = 0.0
) -> float | None:
    """When the reply sounding at ``onset`` last sounded, from (arrival,
    peak) pairs in arrival order, counted from ``lead_s`` before the onset:
    the last sounding one before 100 ms of quiet. A sound that starts more
    than FIRST_GAP_S after the onset (the answer to the interruption, after
    a reply that ran out of itself) is not that reply's."""
    last = None
    for arrived, peak in sounds:
        if arrived < onset - lead_s or peak <= SOUNDING_PEAK:
            continue
        since, allowed = (onset, FIRST_GAP_S) if last is None else (last, 0.1)
        if arrived - since > allowed:
            break
        last = arrived
    return last


def last_sound_after(client: RealtimeClient, onset: float) -> float | None:
    """``last_sound`` of what the client received."""
    received = client.received
    peaks = (
        (arrived, int(np.abs(samples).max()) if samples.size else 0)
        for samples, arrived in zip(received.chunks, received.arrivals, strict=True)
    )
    return last_sound(peaks, onset)
