"""The media worker processes behind the front (``--workers N``): starting
them, restarting one that dies, counting each one's calls, and finding the
worker that owns a call.

A call's id names its worker (``rtc_w3_...``), so a DELETE reaches the
owner without a lookup table. Each worker streams its calls' starts and
ends (``server/worker.py``), so the pool's counts follow the truth without
polling; offers in flight are counted as reservations until answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import site
import sys
from collections import OrderedDict
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from voice_agent.config import Settings
from voice_agent.cpu import available_cores, default_max_calls, media_workers_for
from voice_agent.engine import SharedModelLinks
from voice_agent.server.drain import DRAIN_PATH, GOODBYE_LIMIT_S
from voice_agent.server.worker_protocol import EVENTS_PATH, WorkerConfig, WorkerLinks

log = logging.getLogger(__name__)


def same_code_interpreter() -> tuple[list[str], dict[str, str]]:
    """The command and environment for a Python that imports the
    voice_agent this process runs: ``-m`` would otherwise put the working
    directory first, and a checkout's voice_agent/ there (another build's)
    would answer this front's calls. The package's root leads the path,
    unless it is site-packages (already on it, and not to go ahead of the
    standard library)."""
    root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    installed = {str(Path(p).resolve()) for p in site.getsitepackages()}
    if root not in installed:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (root, env.get("PYTHONPATH"))))
    return [sys.executable, "-P"], env


def media_workers(settings: Settings, capacity: int | None = None) -> int:
    """``--workers`` when given; else as many as the capacity needs on the
    available cores (before it is measured: ``--max-calls`` or the fixed
    estimate a core)."""
    if settings.workers is not None:
        return settings.workers
    calls = capacity or settings.max_calls or default_max_calls()
    return media_workers_for(calls, available_cores())


WORKER_ID = re.compile(r"rtc_w(\d+)_[A-Za-z0-9]+")
# Ended calls a worker remembers, so an answer read after its call's end
# still gives back the call's reservation.
ENDED_KEPT = 256
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
RESTART_BACKOFF_S = (1.0, 30.0)  # first wait, then doubling up to this


class WorkerStartError(RuntimeError):
    """A worker process did not come up."""


@dataclass
class Worker:
    index: int
    socket: str
    process: asyncio.subprocess.Process | None = None
    http: aiohttp.ClientSession | None = None
    live: set[str] = field(default_factory=set)
    reserved: int = 0
    # Calls answered 201 whose start the worker's stream has not reported
    # yet: they keep their reservation until it does, so a burst of offers
    # never sees this worker emptier than it is.
    unseen: set[str] = field(default_factory=set)
    ended_lately: OrderedDict[str, None] = field(default_factory=OrderedDict)
    up: bool = False
    # Launched ahead, importing its code and loading its own models while the
    # front loads the shared ones: it waits for its links on stdin.
    waiting: bool = False
    restarts: int = 0
    base_url: str = "http://worker"

    @property
    def load(self) -> int:
        return len(self.live) + self.reserved

    def release(self) -> None:
        """An offer sent here made no call (or its call is counted as live)."""
        self.reserved = max(0, self.reserved - 1)  # zeroed already if it died meanwhile

    def answered(self, call_id: str) -> None:
        """An offer sent here made this call. Its start, and even its end,
        may have been reported already (a call that failed at once while
        this process was busy): either way its reservation is given back."""
        if call_id in self.live or call_id in self.ended_lately:
            self.release()
        else:
            self.unseen.add(call_id)

    def over(self, call_id: str) -> None:
        """The stream reported this call ended (or a snapshot left it out)."""
        self.live.discard(call_id)
        self.ended_lately[call_id] = None
        while len(self.ended_lately) > ENDED_KEPT:
            self.ended_lately.popitem(last=False)
        if call_id in self.unseen:  # answered, its start never reported
            self.unseen.discard(call_id)
            self.release()

    def knows(self, call_id: str) -> bool:
        """A call of this worker's: live, or answered and not reported yet."""
        return call_id in self.live or call_id in self.unseen

    def seen(self, live: set[str]) -> None:
        """The stream reported these calls (or, in a snapshot, all there
        are: an answered call missing from one has ended already)."""
        for call_id in [c for c in self.unseen if c in live]:
            self.unseen.discard(call_id)
            self.release()

    def status(self) -> dict[str, object]:
        return {
            "index": self.index,
            "up": self.up,
            "pid": self.process.pid if self.process else None,
            "calls": len(self.live),
            "restarts": self.restarts,
        }


class WorkerPool:
    def __init__(self, settings: Settings, runtime_dir: Path, count: int) -> None:
        self.settings = settings
        # The front sets the measured capacity once its models are loaded.
        self.max_calls = settings.max_calls or default_max_calls()
        self._links: SharedModelLinks | None = None  # known once the models are loaded
        self._runtime_dir = runtime_dir
        self.workers: list[Worker] = []
        self.add_workers(count)
        self._tasks: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._draining = False  # a worker that exits now is not restarted
        self.started = False  # every worker has been launched once
        self.refused_full = 0
        # Told ("ended", call id) as calls end, like a CallRegistry's listeners.
        self.listeners: list[Callable[[str, str], None]] = []

    # -- capacity and routing ------------------------------------------------
    @property
    def calls(self) -> int:
        return sum(len(w.live) for w in self.workers)

    @property
    def load(self) -> float:
        return sum(w.load for w in self.workers) / self.max_calls

    @property
    def full(self) -> bool:
        return sum(w.load for w in self.workers) >= self.max_calls

    @property
    def up(self) -> int:
        return sum(w.up for w in self.workers)

    def reserve(self) -> Worker | None:
        """The least-loaded worker that is up, with a slot claimed on it;
        None when the service is full or no worker is up."""
        candidates = [w for w in self.workers if w.up]
        if self.full or not candidates:
            return None
        chosen = min(candidates, key=lambda w: w.load)
        chosen.reserved += 1
        return chosen

    def owner(self, call_id: str) -> Worker | None:
        match = WORKER_ID.fullmatch(call_id)
        if match is None or int(match.group(1)) >= len(self.workers):
            return None
        worker = self.workers[int(match.group(1))]
        return worker if worker.up else None

    # -- processes ------------------------------------------------------------
    def add_workers(self, count: int) -> None:
        """``count`` more workers, started by start() (the capacity measured
        at start-up can need more than were launched ahead)."""
        first = len(self.workers)
        self.workers += [
            Worker(i, str(self._runtime_dir / f"worker-{i}.sock"))
            for i in range(first, first + count)
        ]

    async def launch_ahead(self) -> None:
        """Start every worker's process now, before the links exist, and
        send it who it is and the settings: its imports (~1.2 s of aiortc,
        aiohttp, numpy...) and its own models (the VAD, the end-of-turn
        model) then overlap the front's model loading, and start() only
        sends the links."""
        for worker in self.workers:
            process = await self._spawn_process()
            worker.process = process
            worker.waiting = await self._send(process, self._identity(worker))

    async def start(self, links: SharedModelLinks) -> None:
        """Start every worker; fails if any does not come up."""
        self._links = links
        await asyncio.gather(*(self._launch(w) for w in self.workers))
        for worker in self.workers:
            self._spawn(self._supervise(worker), f"worker-{worker.index}-supervisor")
        self.started = True

    def _identity(self, worker: Worker) -> str:
        """The first line a worker reads: its index, socket and settings."""
        # Admission, authentication and rate limits are the front's; a worker,
        # on its private socket, takes what it is sent.
        settings = self.settings.model_copy(
            update={
                "offers_per_minute": 0,
                "workers": 0,
                "auth": "off",
                "api_keys": [],
                "api_keys_file": None,
            }
        )
        config = WorkerConfig(
            index=worker.index,
            socket=worker.socket,
            settings=settings.model_dump(mode="json"),
        )
        return json.dumps(asdict(config)) + "\n"

    def _links_line(self) -> str:
        """The second line, once the front's models are up: where they
        are, and the capacity measured with them."""
        assert self._links is not None
        return json.dumps(asdict(WorkerLinks(asdict(self._links), self.max_calls))) + "\n"

    async def _spawn_process(self) -> asyncio.subprocess.Process:
        interpreter, env = same_code_interpreter()
        return await asyncio.create_subprocess_exec(
            *interpreter,
            "-m",
            "voice_agent.server.worker",
            env=env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )

    @staticmethod
    async def _send(process: asyncio.subprocess.Process, *lines: str) -> bool:
        """Write ``lines`` to the worker's stdin; False if it has exited
        (its pipe closed) before taking them."""
        assert process.stdin is not None
        if process.returncode is not None:
            return False
        try:
            process.stdin.write("".join(lines).encode())
            await process.stdin.drain()  # stays open: its end tells the worker we are gone
        except (BrokenPipeError, ConnectionResetError):
            return False
        return True

    async def _launch(self, worker: Worker) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(worker.socket)
        process = worker.process if worker.waiting else None
        worker.waiting = False
        if process is not None and not await self._send(process, self._links_line()):
            log.warning(
                "media worker exited before it was linked (its own models failed to "
                "load?); starting another",
                extra={"worker": worker.index, "exit_code": await process.wait()},
            )
            process = None
        if process is None:  # a restart, or one that died waiting
            process = await self._spawn_process()
            worker.process = process
            # One that dies at once ends its output: "did not start", below.
            await self._send(process, self._identity(worker), self._links_line())
        assert process.stdout is not None
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                line = await process.stdout.readline()
        except TimeoutError:
            line = b""
        if line.strip() != b"ready":
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            code = await process.wait()
            raise WorkerStartError(f"media worker {worker.index} did not start (exit code {code})")
        worker.http = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=worker.socket),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        )
        worker.up = True
        self._spawn(self._follow_calls(worker, process), f"worker-{worker.index}-calls")
        log.info("media worker up", extra={"worker": worker.index, "pid": process.pid})

    async def _follow_calls(self, worker: Worker, process: asyncio.subprocess.Process) -> None:
        """Keep ``worker.live`` equal to the worker's calls, from its stream."""
        while worker.process is process and process.returncode is None and worker.http:
            try:
                async with worker.http.get(worker.base_url + EVENTS_PATH) as response:
                    async for raw in response.content:
                        event = json.loads(raw)
                        if "live" in event:
                            # A snapshot: an answered call left out of it is
                            # over (its whole life may have fallen in a gap
                            # of the stream), and so is a live one left out.
                            live = set(event["live"])
                            self._ended(worker, (worker.live | worker.unseen) - live)
                            worker.live = live
                            worker.seen(set(worker.unseen))  # answered and live
                        elif "started" in event:
                            worker.live.add(event["started"])
                            worker.seen({event["started"]})
                        elif "ended" in event:
                            self._ended(worker, {event["ended"]})
            except (aiohttp.ClientError, ValueError) as exc:
                if process.returncode is None and not self._stopping:
                    log.warning(
                        "lost a worker's call stream",
                        extra={"worker": worker.index, "error": str(exc)},
                    )
            if self._stopping:
                return
            # The stream ended: the worker exited (the supervisor takes over)
            # or fell behind (subscribe again; the first line is a snapshot).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await process.wait()

    def _ended(self, worker: Worker, call_ids: set[str]) -> None:
        for call_id in call_ids:
            worker.over(call_id)
            for listener in self.listeners:
                listener("ended", call_id)

    async def _supervise(self, worker: Worker) -> None:
        """Restart a worker that exits while the service runs. Its calls are
        gone with it; the other workers' calls are not affected."""
        backoff = RESTART_BACKOFF_S[0]
        while not self._stopping and not self._draining:
            process = worker.process
            assert process is not None
            code = await process.wait()
            worker.up = False
            self._ended(worker, worker.live | worker.unseen)  # answered calls too
            worker.reserved = 0
            worker.unseen.clear()
            if self._stopping or self._draining:
                return
            log.error(
                "media worker died; restarting",
                extra={"worker": worker.index, "exit_code": code, "backoff_s": backoff},
            )
            await self._close_http(worker)
            while not self._stopping:
                await asyncio.sleep(backoff)  # restart backoff, not a poll
                try:
                    await self._launch(worker)
                    worker.restarts += 1
                    backoff = RESTART_BACKOFF_S[0]
                    break
                except (WorkerStartError, OSError) as exc:
                    log.error("media worker restart failed", extra={"error": str(exc)})
                    backoff = min(backoff * 2, RESTART_BACKOFF_S[1])

    async def drain(self) -> None:
        """Have every worker drain its calls (``server/drain.py``), all at once."""
        self._draining = True
        await asyncio.gather(*(self._drain_worker(w) for w in self.workers))

    async def _drain_worker(self, worker: Worker) -> None:
        if not worker.up or worker.http is None:
            return
        bound = self.settings.drain_timeout_s + GOODBYE_LIMIT_S + STOP_TIMEOUT_S
        try:
            timeout = aiohttp.ClientTimeout(total=bound)
            async with worker.http.post(f"{worker.base_url}{DRAIN_PATH}", timeout=timeout) as r:
                await r.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("draining a media worker failed", extra={"w": worker.index, "e": str(exc)})

    async def stop(self) -> None:
        """End every worker (each closes its calls first) and wait for it."""
        self._stopping = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*(self._stop_worker(w) for w in self.workers))
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _stop_worker(self, worker: Worker) -> None:
        worker.up = False
        process = worker.process
        if process is not None and process.returncode is None:
            # End of its stdin: stop now (SIGTERM would have it drain first).
            if process.stdin is not None:
                process.stdin.close()
            try:
                async with asyncio.timeout(STOP_TIMEOUT_S):
                    await process.wait()
            except TimeoutError:
                log.warning("media worker did not stop; killing it", extra={"w": worker.index})
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
        if process is not None and process.stdin is not None:
            process.stdin.close()
        await self._close_http(worker)

    async def _close_http(self, worker: Worker) -> None:
        http, worker.http = worker.http, None
        if http is not None:
            await http.close()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
