"""The model's recent busy share: what optional work (live partials) asks
before it takes the model's time."""

from __future__ import annotations

import asyncio
import time

import pytest

from voice_agent.backends.runtime.batching import BatchingWorker
from voice_agent.backends.runtime.busy_share import BusyShare


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_share_counts_batches_inside_the_window_only() -> None:
    clock = Clock()
    share = BusyShare(window_s=3.0, clock=clock)
    assert share.share() == 0.0
    share.started(1)
    clock.now += 0.6
    assert share.share() == pytest.approx(0.2)  # a batch still running counts
    share.ended(1)
    clock.now += 1.0
    assert share.share() == pytest.approx(0.2)
    # The window slides past it: half of it, then none.
    clock.now += 1.7
    assert share.share() == pytest.approx(0.1)
    clock.now += 1.0
    assert share.share() == 0.0
    share.ended(2)  # never started: nothing counted
    assert share.share() == 0.0


def test_lanes_share_the_window_and_the_share_is_at_most_one() -> None:
    clock = Clock()
    share = BusyShare(window_s=2.0, lanes=2, clock=clock)
    share.started(1)
    share.started(2)
    clock.now += 1.0
    assert share.share() == pytest.approx(0.5)
    share.ended(2)
    clock.now += 10.0
    assert share.share() == pytest.approx(0.5)  # one lane of two, the whole window
    single = BusyShare(window_s=1.0, clock=clock)
    single.started(1)
    single.started(2)
    clock.now += 1.0
    assert single.share() == 1.0
    with pytest.raises(ValueError):
        BusyShare(window_s=0)


async def test_a_worker_s_share_follows_the_batches_it_runs() -> None:
    def slow_double(batch: list[int]) -> list[int]:
        time.sleep(0.3)  # a model's inference, in the worker's thread
        return [2 * x for x in batch]

    worker: BatchingWorker[int, int] = BatchingWorker("busy", slow_double, 1, 0.0)
    try:
        assert worker.busy_share.share() == 0.0
        assert list(await asyncio.gather(worker.submit(1), worker.submit(2))) == [2, 4]
        # Two batches of 0.3 s one after the other, in the last 3 s.
        assert 0.19 <= worker.busy_share.share() <= 0.5
    finally:
        worker.close()
