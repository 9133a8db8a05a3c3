"""The dynamic batching worker: batches, priorities, cancellation, closing.

The batch function is a real computation (it scales each input and records
what it was given), so a mix-up between requests and results shows."""

from __future__ import annotations

import asyncio
import threading

import pytest

from voice_agent.backends.runtime.batching import BatchingWorker, WorkerClosed
from voice_agent.testing.waiting import until


class Model:
    """Doubles numbers; ``gate`` holds a batch inside the worker thread."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.threads: set[str] = set()
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()

    def __call__(self, batch: list[int]) -> list[int]:
        self.threads.add(threading.current_thread().name)
        self.batches.append(list(batch))
        self.entered.set()
        self.gate.wait(10)
        return [2 * x for x in batch]


def has_waiters(semaphore: asyncio.Semaphore) -> bool:
    """Whether a task is blocked on ``semaphore`` (asyncio keeps no public count)."""
    return any(not waiter.done() for waiter in semaphore._waiters or ())


async def hold(model: Model, worker: BatchingWorker[int, int]) -> asyncio.Task[int]:
    """Occupy the worker with one final request until the gate opens."""
    model.gate.clear()
    model.entered.clear()
    task = asyncio.create_task(worker.submit(-1))
    await asyncio.to_thread(model.entered.wait, 10)
    return task


async def test_concurrent_requests_share_batches_and_get_their_own_results() -> None:
    model = Model()
    worker = BatchingWorker("t", model, max_batch=4, max_wait_s=0.2)
    try:
        results = await asyncio.gather(*(worker.submit(i) for i in range(10)))
    finally:
        worker.close()
    assert results == [2 * i for i in range(10)]
    assert all(len(batch) <= 4 for batch in model.batches)
    assert max(len(batch) for batch in model.batches) == 4
    assert sorted(x for batch in model.batches for x in batch) == list(range(10))
    assert model.threads == {next(iter(model.threads))}  # one dedicated thread
    assert threading.current_thread().name not in model.threads
    snapshot = worker.stats.snapshot()
    assert snapshot["batches"] == len(model.batches) and snapshot["max_batch_seen"] == 4


async def test_a_request_cancelled_while_queued_never_runs() -> None:
    model = Model()
    worker = BatchingWorker("t", model, max_batch=8, max_wait_s=0.0)
    try:
        running = await hold(model, worker)
        kept = asyncio.create_task(worker.submit(1))
        dropped = asyncio.create_task(worker.submit(2))
        await until(lambda: len(worker._finals) == 2)  # both queued behind the held batch
        dropped.cancel()
        model.gate.set()
        assert await running == -2 and await kept == 2
        with pytest.raises(asyncio.CancelledError):
            await dropped
    finally:
        worker.close()
    assert model.batches == [[-1], [1]]
    assert worker.stats.requests["cancelled"] == 1


async def test_the_only_request_cancelled_while_waiting_for_the_thread_leaves_the_loop_alive(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Seen under load: a speculation dropped while its request waited for
    # the busy thread; the loop then found nothing to gather and died.
    model = Model()
    worker = BatchingWorker("t", model, max_batch=8, max_wait_s=0.0)
    try:
        running = await hold(model, worker)
        dropped = asyncio.create_task(worker.submit(2))
        # Queued, and the loop it woke waits for the thread the held batch has.
        await until(lambda: bool(worker._finals) and has_waiters(worker._free_threads))
        loop_task = worker._task
        dropped.cancel()
        with pytest.raises(asyncio.CancelledError):
            await dropped
        model.gate.set()
        assert await running == -2
        # The loop took the freed thread, found nothing queued and gave it
        # back (or died doing so, which the checks below report).
        await until(lambda: not worker._free_threads.locked() or worker._task is not loop_task)
        assert await worker.submit(3) == 6
        assert worker._task is loop_task  # the same loop, not a restarted one
    finally:
        worker.close()
    assert "batching loop died" not in caplog.text
    assert model.batches == [[-1], [3]]


async def test_finals_run_before_partials_and_partials_are_skipped_when_busy() -> None:
    model = Model()
    worker = BatchingWorker("t", model, max_batch=8, max_wait_s=0.0)
    try:
        running = await hold(model, worker)
        # A final is running: a partial is refused at once.
        assert await worker.submit_partial(7) is None
        model.gate.set()
        await running
        # Idle: a partial runs.
        assert await worker.submit_partial(7) == 14
        # A partial queued behind a running batch gives way to a final that
        # arrives after it, and never shares its batch.
        running = await hold(model, worker)
        model.batches.clear()
        worker_busy_with_partial = asyncio.create_task(worker.submit_partial(3))
        await asyncio.sleep(0)  # one step: refused at once, not after waiting
        assert worker_busy_with_partial.done() and worker_busy_with_partial.result() is None
        model.gate.set()
        await running
        model.gate.clear()
        model.entered.clear()
        partial = asyncio.create_task(worker.submit_partial(5))
        await asyncio.to_thread(model.entered.wait, 10)  # the partial batch runs
        queued_partial = asyncio.create_task(worker.submit_partial(6))
        final = asyncio.create_task(worker.submit(4))
        await until(lambda: bool(worker._partials) and bool(worker._finals))  # both queued
        model.gate.set()
        assert await partial == 10 and await final == 8 and await queued_partial == 12
    finally:
        worker.close()
    assert model.batches[-3:] == [[5], [4], [6]]
    assert worker.stats.requests["partial_skipped"] == 2


async def test_partial_batches_stay_small_so_a_final_waits_for_little() -> None:
    model = Model()
    worker = BatchingWorker("t", model, max_batch=8, max_wait_s=0.05, max_partial_batch=2)
    try:
        model.gate.clear()
        model.entered.clear()
        first = asyncio.create_task(worker.submit_partial(0))
        await asyncio.to_thread(model.entered.wait, 10)  # a partial batch runs
        queued = [asyncio.create_task(worker.submit_partial(i)) for i in range(1, 6)]
        await until(lambda: len(worker._partials) == 5)
        model.gate.set()
        results = await asyncio.gather(first, *queued)
    finally:
        worker.close()
    assert results == [0, 2, 4, 6, 8, 10]
    assert model.batches == [[0], [1, 2], [3, 4], [5]]


async def test_close_fails_waiting_requests_and_refuses_new_ones() -> None:
    model = Model()
    worker = BatchingWorker("t", model, max_batch=1, max_wait_s=0.0)
    running = await hold(model, worker)
    queued = asyncio.create_task(worker.submit(1))
    await until(lambda: len(worker._finals) == 1)
    worker.close()
    model.gate.set()
    for task in (running, queued):
        with pytest.raises(WorkerClosed):
            await task
    with pytest.raises(WorkerClosed):
        await worker.submit(3)


async def test_a_failing_batch_fails_its_requests_only() -> None:
    def model(batch: list[int]) -> list[int]:
        if 0 in batch:
            raise ValueError("zero")
        return batch

    worker = BatchingWorker("t", model, max_batch=1, max_wait_s=0.0)
    try:
        with pytest.raises(ValueError, match="zero"):
            await worker.submit(0)
        assert await worker.submit(5) == 5
    finally:
        worker.close()


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        BatchingWorker("t", lambda b: b, max_batch=0, max_wait_s=0.0)
    with pytest.raises(ValueError):
        BatchingWorker("t", lambda b: b, max_batch=1, max_wait_s=0.0, max_partial_batch=0)


async def test_close_fails_a_final_still_waiting_for_queue_room() -> None:
    model = Model()
    worker = BatchingWorker("t", model, max_batch=1, max_wait_s=0.0, max_queue=1)
    running = await hold(model, worker)
    waiting = asyncio.create_task(worker.submit(1))  # no room: the running final holds it
    await until(lambda: has_waiters(worker._room))
    worker.close()
    model.gate.set()
    async with asyncio.timeout(10):
        for task in (running, waiting):
            with pytest.raises(WorkerClosed):
                await task
    assert model.batches == [[-1]]


class Fatal(BaseException):
    """Not an Exception: would end whatever task it reached."""


@pytest.mark.parametrize("error", [StopIteration("done"), Fatal("boom")], ids=repr)
async def test_a_model_raising_what_a_future_cannot_hold_fails_its_request_only(
    error: BaseException,
) -> None:
    def model(batch: list[int]) -> list[int]:
        if 0 in batch:
            raise error
        return [2 * x for x in batch]

    worker = BatchingWorker("t", model, max_batch=1, max_wait_s=0.0)
    try:
        async with asyncio.timeout(10):
            with pytest.raises(RuntimeError, match="the model raised") as raised:
                await worker.submit(0)
            assert raised.value.__cause__ is error
            assert await worker.submit(5) == 10  # the worker still serves
    finally:
        worker.close()


async def test_a_dead_batching_loop_fails_its_requests_and_is_restarted() -> None:
    model = Model()
    worker = BatchingWorker("t", model, max_batch=1, max_wait_s=0.0)
    try:
        running = await hold(model, worker)
        queued = asyncio.create_task(worker.submit(1))
        await until(lambda: len(worker._finals) == 1)
        loop_task = worker._task
        assert loop_task is not None
        loop_task.cancel()  # stands in for a bug that ends the loop
        async with asyncio.timeout(10):
            for task in (running, queued):
                with pytest.raises(RuntimeError, match="batching loop stopped"):
                    await task
        model.gate.set()
        async with asyncio.timeout(10):
            assert await worker.submit(3) == 6
        assert worker._task is not loop_task
    finally:
        worker.close()


async def test_a_parallel_worker_runs_batches_side_by_side_finals_still_first() -> None:
    side_by_side = threading.Barrier(2, timeout=10)  # broken unless two batches run at once
    gate = threading.Event()
    final_running = threading.Event()

    def model(batch: list[int]) -> list[int]:
        if batch[0] < 0:  # the two batches that must overlap
            side_by_side.wait()
        elif batch[0] == 5:  # a final held running
            final_running.set()
            gate.wait(10)
        return [2 * x for x in batch]

    worker = BatchingWorker("t", model, max_batch=1, max_wait_s=0.0, parallel=2)
    try:
        assert list(await asyncio.gather(worker.submit(-1), worker.submit(-2))) == [-2, -4]
        # While a final runs (and a thread is free), a partial is still refused.
        final = asyncio.create_task(worker.submit(5))
        await asyncio.to_thread(final_running.wait, 10)  # the final's batch is running
        assert await worker.submit_partial(7) is None
        gate.set()
        assert await final == 10
        assert worker.stats.snapshot()["batches"] == 3
    finally:
        worker.close()


async def test_close_fails_a_batch_formed_but_not_yet_started() -> None:
    """close() between the loop taking a batch off the queue and that
    batch's task first running: its callers must not wait forever."""
    model = Model()
    worker = BatchingWorker("t", model, max_batch=1, max_wait_s=0.0)
    submitted = asyncio.create_task(worker.submit(1))
    # Each sleep(0) lets the tasks queued before this one run one step: the
    # submit (which starts the loop), then the loop (which forms the batch
    # and queues its task behind this one).
    for _ in range(2):
        await asyncio.sleep(0)
    assert worker._batches, "the batch was not formed yet"
    worker.close()
    async with asyncio.timeout(5):
        with pytest.raises(WorkerClosed):
            await submitted
    assert model.batches == []


async def test_slow_work_of_a_higher_rank_never_rides_in_nor_holds_up_a_batch() -> None:
    """Ranked requests (here: numbers of 100 and more are the slow kind,
    as a safe re-decode is) batch only with their own rank, after the
    lower rank waiting, in arrival order within a rank."""
    model = Model()
    worker = BatchingWorker("t", model, max_batch=4, max_wait_s=0.0, rank=lambda x: int(x >= 100))
    try:
        held = await hold(model, worker)
        queued = [asyncio.create_task(worker.submit(x)) for x in (100, 1, 101, 2, 3)]
        await until(lambda: len(worker._finals) == 5)  # all queued behind the held batch
        model.gate.set()
        results = await asyncio.gather(held, *queued)
    finally:
        worker.close()
    assert results == [-2, 200, 2, 202, 4, 6]
    assert model.batches == [[-1], [1, 2, 3], [100, 101]]
