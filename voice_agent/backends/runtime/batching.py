"""A process-wide dynamic batching worker for one model.

Requests from every session wait in one of two bounded queues, finals before
partials. When the first request arrives the worker waits up to ``max_wait_s``
for more (or until ``max_batch`` are waiting), then runs the whole batch in
its one dedicated thread, so one model (and one GPU) serves many calls and
blocking inference never runs on the event loop.

Partials (live transcripts of speech in progress) are the bounded compute
budget: a batch is either all finals or all partials, partials only run when
no final is waiting, and a partial is refused outright (``None``) while
finals are queued or running, or while the partial queue is full. So partials
never share a batch with a final nor make one wait behind them in the queue;
the most a final can wait for is one partial batch already running, and a
partial batch holds at most ``max_partial_batch`` requests (the backend
bounds each one's length).

A request cancelled while queued (barge-in, hang-up) is dropped before its
batch runs; one cancelled while its batch runs gets no result delivered.

With ``parallel`` above 1 (a machine with many more cores than one batch
uses), up to that many batches run at once, each in its own thread of the
one model (CTranslate2 and ONNX Runtime serve concurrent calls): a batch
is formed whenever a thread is free, so queueing stays short on a big host
while a small one keeps exactly one batch at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, Literal, TypeVar

from voice_agent.backends.base import InferenceWorker
from voice_agent.backends.runtime.busy_share import BusyShare
from voice_agent.backends.runtime.durations import Durations

log = logging.getLogger(__name__)

Req = TypeVar("Req")
Res = TypeVar("Res")
Priority = Literal["final", "partial"]


class WorkerClosed(RuntimeError):
    """The worker was closed while a request waited."""


@dataclass
class _Request(Generic[Req, Res]):
    item: Req
    priority: Priority
    future: asyncio.Future[Res]
    enqueued: float = field(default_factory=time.monotonic)


@dataclass
class BatchStats:
    """What the worker has done since it started."""

    batch_sizes: dict[int, int] = field(default_factory=dict)  # size -> batches
    queue_wait: Durations = field(default_factory=Durations)
    inference: Durations = field(default_factory=Durations)
    requests: dict[str, int] = field(
        default_factory=lambda: {"final": 0, "partial": 0, "partial_skipped": 0, "cancelled": 0}
    )

    def snapshot(self) -> dict[str, object]:
        return {
            "batch_sizes": {str(size): n for size, n in sorted(self.batch_sizes.items())},
            "batches": sum(self.batch_sizes.values()),
            "max_batch_seen": max(self.batch_sizes, default=0),
            "queue_wait": self.queue_wait.summary_ms(),
            "inference": self.inference.summary_ms(),
            "requests": dict(self.requests),
        }


class BatchingWorker(Generic[Req, Res]):
    def __init__(
        self,
        name: str,
        run_batch: Callable[[list[Req]], Sequence[Res]],
        max_batch: int,
        max_wait_s: float,
        max_queue: int = 256,
        max_partials: int = 64,
        max_partial_batch: int = 2,
        parallel: int = 1,
        rank: Callable[[Req], int] = lambda item: 0,
        lowered: bool = True,
        optional: Callable[[Req], bool] = lambda item: False,
    ) -> None:
        """``rank``: among waiting requests of one priority, a batch takes
        only those of the lowest rank (the rest wait for the next batch), so
        slow work (a safe re-decode) never rides in, nor holds up, a batch
        of fast work. ``lowered`` False keeps the thread at the process's
        priority (InferenceWorker). ``optional``: work that asks
        ``busy_share`` before it is submitted, left out of it (a batch of it
        alone is not the load it should yield to)."""
        if min(max_batch, max_queue, max_partial_batch, parallel) < 1 or max_wait_s < 0:
            raise ValueError(
                "max_batch, max_partial_batch, max_queue and parallel must be >= 1, max_wait_s >= 0"
            )
        self.name = name
        self.max_batch = max_batch
        self.max_partial_batch = max_partial_batch
        self.max_wait_s = max_wait_s
        self._run_batch = run_batch
        self._rank = rank
        self._optional = optional
        self._thread = InferenceWorker(name, parallel, lowered)
        self._free_threads = asyncio.Semaphore(parallel)
        self._finals: deque[_Request[Req, Res]] = deque()
        self._partials: deque[_Request[Req, Res]] = deque()
        self._max_partials = max_partials
        # Bounded: a final waits for room (backpressure), a partial is refused.
        self._room = asyncio.Semaphore(max_queue)
        self._arrived = asyncio.Event()
        self._running: dict[Priority, int] = {"final": 0, "partial": 0}  # batches
        self._in_flight: list[_Request[Req, Res]] = []
        self._batches: set[asyncio.Task[None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.stats = BatchStats()
        # What share of the last seconds batches of required work ran:
        # optional work asks it.
        self.busy_share = BusyShare(lanes=parallel)

    # -- submitting -----------------------------------------------------------
    async def submit(self, item: Req) -> Res:
        """Queue a final request and wait for its result. Cancelling the
        caller removes the request (if its batch hasn't started)."""
        self._check_open()
        async with self._room:
            return await self._enqueue(item, "final", self._finals)

    async def submit_partial(self, item: Req) -> Res | None:
        """Run a low-priority request, or return None at once when finals are
        waiting or running (or too many partials are queued)."""
        self._check_open()
        if (
            self._finals
            or self._running["final"]
            or len(self._partials) >= self._max_partials
            or self._room.locked()
        ):
            self.stats.requests["partial_skipped"] += 1
            return None
        async with self._room:
            return await self._enqueue(item, "partial", self._partials)

    @property
    def busy(self) -> bool:
        """Whether any request waits or runs."""
        return bool(self._pending() or self._in_flight)

    @property
    def in_flight(self) -> int:
        """Requests whose batch the model is running."""
        return len(self._in_flight)

    def _check_open(self) -> None:
        if self._closed:
            raise WorkerClosed(f"{self.name} worker is closed")

    async def _enqueue(
        self, item: Req, priority: Priority, queue: deque[_Request[Req, Res]]
    ) -> Res:
        # close() may have run while this request waited for room: nothing
        # would ever take it off the queue.
        self._check_open()
        future: asyncio.Future[Res] = asyncio.get_running_loop().create_future()
        request = _Request(item, priority, future)
        queue.append(request)
        self.stats.requests[priority] += 1
        self._arrived.set()
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name=f"{self.name}-batcher")
            self._task.add_done_callback(self._on_loop_done)
        try:
            return await future
        except asyncio.CancelledError:
            # Still queued: take it out now so it neither runs nor holds room.
            with contextlib.suppress(ValueError):
                queue.remove(request)
            self.stats.requests["cancelled"] += 1
            raise

    # -- the batching loop ------------------------------------------------------
    def _on_loop_done(self, task: asyncio.Task[None]) -> None:
        """The loop only ends when close() cancels it. If it dies otherwise
        (a bug), whatever waits would wait forever: fail it, and let the next
        request start a fresh loop."""
        if self._task is task:
            self._task = None
        if self._closed:
            return
        error = None if task.cancelled() else task.exception()
        log.error(
            "batching loop died",
            exc_info=error,
            extra={"worker": self.name, "cancelled": task.cancelled()},
        )
        self._fail_all(RuntimeError(f"{self.name} batching loop stopped: {error!r}"))
        self._running = {"final": 0, "partial": 0}

    def _fail_all(self, error: Exception) -> None:
        waiting = [*self._in_flight, *self._finals, *self._partials]
        self._in_flight = []
        self._finals.clear()
        self._partials.clear()
        for request in waiting:
            if not request.future.done():
                request.future.set_exception(error)

    def _pending(self) -> int:
        return len(self._finals) + len(self._partials)

    async def _loop(self) -> None:
        while True:
            while not self._pending():
                self._arrived.clear()
                await self._arrived.wait()
            await self._free_threads.acquire()
            if not self._pending():
                # What waited for the thread was cancelled meanwhile (a
                # dropped speculation): nothing to gather.
                self._free_threads.release()
                continue
            try:
                await self._gather()
                batch = self._take()
            except BaseException:
                self._free_threads.release()
                raise
            if not batch:
                self._free_threads.release()
                continue
            # In flight from now, not from the task's first step: a close()
            # before that step cancels the task unstarted, and must still
            # find these requests to fail them.
            self._batch_started(batch)
            # Not awaited: the next batch forms while this one runs, when a
            # thread is free for it (with one thread, right after this one).
            task = asyncio.create_task(self._run(batch), name=f"{self.name}-batch")
            self._batches.add(task)
            task.add_done_callback(self._batch_done)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self._batches.discard(task)
        self._free_threads.release()
        if not task.cancelled() and (error := task.exception()) is not None:
            # A bug in the bookkeeping, not the model (whose errors reach the
            # callers): whatever waits would wait forever. Fail it all.
            log.error("batch task died", exc_info=error, extra={"worker": self.name})
            self._fail_all(RuntimeError(f"{self.name} batch failed: {error!r}"))

    async def _gather(self) -> None:
        """Wait for more requests until the batch is full or the oldest
        waiting one has waited ``max_wait_s``."""
        oldest = min(queue[0].enqueued for queue in (self._finals, self._partials) if queue)
        while self._pending() < (self.max_batch if self._finals else self.max_partial_batch):
            remaining = oldest + self.max_wait_s - time.monotonic()
            if remaining <= 0:
                return
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._arrived.wait()

    def _take(self) -> list[_Request[Req, Res]]:
        queue, limit = (
            (self._finals, self.max_batch)
            if self._finals
            else (self._partials, self.max_partial_batch)
        )
        live = [r for r in queue if not r.future.done()]  # not cancelled while queued
        queue.clear()
        if not live:
            return []
        best = min(self._rank(r.item) for r in live)
        batch = [r for r in live if self._rank(r.item) == best][:limit]
        taken = {id(r) for r in batch}  # by identity: requests hold arrays
        queue.extend(r for r in live if id(r) not in taken)
        return batch

    def _batch_started(self, batch: list[_Request[Req, Res]]) -> None:
        started = time.monotonic()
        for request in batch:
            self.stats.queue_wait.add(started - request.enqueued)
        self._running[batch[0].priority] += 1
        self._in_flight += batch
        if not all(self._optional(r.item) for r in batch):
            self.busy_share.started(id(batch))

    async def _run(self, batch: list[_Request[Req, Res]]) -> None:
        started = time.monotonic()
        try:
            results = await self._thread.run(self._call_model, [r.item for r in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"{self.name}: {len(results)} results for {len(batch)} inputs")
        except Exception as exc:
            self._batch_ended(batch)
            log.warning("batch failed", exc_info=True, extra={"worker": self.name})
            for request in batch:
                if not request.future.done():
                    request.future.set_exception(exc)
            return
        except asyncio.CancelledError:
            self._batch_ended(batch)  # close(): it fails the batch's callers
            raise
        self._batch_ended(batch)
        elapsed = time.monotonic() - started
        self.stats.inference.add(elapsed)
        self.stats.batch_sizes[len(batch)] = self.stats.batch_sizes.get(len(batch), 0) + 1
        log.debug(
            "batch done",
            extra={
                "worker": self.name,
                "size": len(batch),
                "priority": batch[0].priority,
                "inference_ms": round(elapsed * 1000, 1),
            },
        )
        for request, result in zip(batch, results, strict=True):
            if not request.future.done():  # its caller may have gone meanwhile
                request.future.set_result(result)

    def _batch_ended(self, batch: list[_Request[Req, Res]]) -> None:
        priority = batch[0].priority
        self._running[priority] = max(0, self._running[priority] - 1)  # reset if the loop died
        self.busy_share.ended(id(batch))
        ended = {id(r) for r in batch}  # by identity: requests hold arrays
        self._in_flight = [r for r in self._in_flight if id(r) not in ended]

    def _call_model(self, items: list[Req]) -> Sequence[Res]:
        """Runs in the worker thread. Whatever the model raises must reach the
        callers as an ordinary exception: asyncio cannot put StopIteration
        into a future, and a BaseException would end the batching loop."""
        try:
            return self._run_batch(items)
        except StopIteration as exc:
            raise RuntimeError(f"{self.name}: the model raised {exc!r}") from exc
        except Exception:
            raise
        except BaseException as exc:
            raise RuntimeError(f"{self.name}: the model raised {exc!r}") from exc

    def close(self) -> None:
        """Fail whatever waits, stop the loop and the thread."""
        if self._closed:
            return
        self._closed = True
        log.info("batching worker stopped", extra={"worker": self.name, **self.stats.snapshot()})
        if self._task is not None:
            self._task.cancel()
        for task in list(self._batches):
            task.cancel()
        self._fail_all(WorkerClosed(f"{self.name} worker closed"))
        self._thread.close()
