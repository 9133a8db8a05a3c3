"""The front's count of a media worker's calls and reservations, fed by a
real HTTP stream of call events over a Unix socket (what a worker serves at
EVENTS_PATH), in the orders a busy front can read them in: a call's start
and end both reported before its answer is read, and a call whose whole
life falls in a gap of the stream. Each must give back the reservation and
tell the listeners (the key's slot) that the call ended."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest_asyncio
from aiohttp import web

from tests import conftest
from voice_agent.server.place_in_workers import WorkerSlot
from voice_agent.server.worker_pool import Worker, WorkerPool
from voice_agent.server.worker_protocol import EVENTS_PATH


class EventStreams:
    """Serves each subscription the next script of event lines, then ends it."""

    def __init__(self) -> None:
        self.scripts: asyncio.Queue[list[dict[str, object]]] = asyncio.Queue()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        script = await self.scripts.get()
        response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await response.prepare(request)
        for event in script:
            await response.write((json.dumps(event) + "\n").encode())
        return response


@pytest_asyncio.fixture
async def pool_and_streams(tmp_path: Path) -> AsyncIterator[tuple[WorkerPool, EventStreams]]:
    streams = EventStreams()
    app = web.Application()
    app.router.add_get(EVENTS_PATH, streams.handle)
    runner = web.AppRunner(app, handler_cancellation=True)  # a subscription left waiting
    await runner.setup()
    socket = str(tmp_path / "events.sock")
    await web.UnixSite(runner, socket).start()
    pool = WorkerPool(conftest.test_settings(max_calls=2), tmp_path, 1)
    worker = pool.workers[0]
    # A live process stands for the worker's (its stream is followed while it runs).
    process = await asyncio.create_subprocess_exec("sleep", "60")
    worker.process, worker.up = process, True
    worker.http = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket))
    follower = asyncio.create_task(pool._follow_calls(worker, process))
    try:
        yield pool, streams
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)
        process.kill()
        await process.wait()
        await worker.http.close()
        await runner.cleanup()


class Ended:
    """A pool listener: the calls it was told ended, and an event when one is."""

    def __init__(self, pool: WorkerPool) -> None:
        self.calls: list[str] = []
        self.told = asyncio.Event()
        pool.listeners.append(self)

    def __call__(self, change: str, call_id: str) -> None:
        self.calls.append(call_id)
        self.told.set()


async def test_an_answer_read_after_its_call_ended_gives_the_slot_back(
    pool_and_streams: tuple[WorkerPool, EventStreams],
) -> None:
    pool, streams = pool_and_streams
    ended = Ended(pool)
    worker = pool.reserve()
    assert isinstance(worker, Worker) and worker.reserved == 1
    # The worker made the call, which failed at once: start and end are
    # read before the front gets to the worker's 201.
    call = "rtc_w0_early"
    await streams.scripts.put([{"live": []}, {"started": call}, {"ended": call}])
    await asyncio.wait_for(ended.told.wait(), 5)
    worker.answered(call)  # what WorkerSlot.made does with the 201
    assert worker.reserved == 0 and not worker.unseen and not worker.live
    assert pool.load == 0 and pool.reserve() is worker


async def test_a_call_over_within_a_gap_of_the_stream_is_ended_by_the_snapshot(
    pool_and_streams: tuple[WorkerPool, EventStreams],
) -> None:
    pool, streams = pool_and_streams
    ended = Ended(pool)
    await streams.scripts.put([{"live": []}])  # the first subscription, then it ends
    worker = pool.reserve()
    assert isinstance(worker, Worker)
    call = "rtc_w0_unseen"
    worker.answered(call)  # answered; its start and end fell in the gap
    assert worker.unseen == {call} and worker.reserved == 1
    await streams.scripts.put([{"live": []}])  # the next subscription's snapshot
    await asyncio.wait_for(ended.told.wait(), 5)
    assert worker.reserved == 0 and not worker.unseen
    assert ended.calls == [call]  # told once: the key's slot is freed


async def test_a_slot_of_a_worker_that_died_settles_nothing_on_its_successor(
    pool_and_streams: tuple[WorkerPool, EventStreams],
) -> None:
    pool, _ = pool_and_streams
    old = pool.reserve()
    assert isinstance(old, Worker)
    slot, answered_slot = WorkerSlot(old), WorkerSlot(old)
    # The worker died (its reservations zeroed) and a new process took its
    # place, where a new offer holds a reservation.
    dead = old.process
    successor = await asyncio.create_subprocess_exec("sleep", "60")
    try:
        old.process, old.reserved = successor, 0
        assert pool.reserve() is old and old.reserved == 1
        slot.release()  # the old offer's refusal, late
        answered_slot.made("rtc_w0_late")  # the old offer's answer, late
        assert old.reserved == 1 and not old.unseen
        WorkerSlot(old).release()  # the new offer's own refusal counts
        assert old.reserved == 0
    finally:
        old.process = dead
        successor.kill()
        await successor.wait()
