"""The embedded LLM: llama.cpp's OpenAI-compatible server on a loopback port,
started and supervised by the service when no other endpoint is configured.

It runs as a child process so that generation never holds our event loop's
GIL. The child is only called ready once it has answered a real one-token
completion (a build that does not fit the CPU starts fine and dies on its
first decode), and it is restarted with backoff if it dies. Every death is
kept with its signal and last output lines: three within a minute is a crash
loop, reported until a restarted child answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any

import aiohttp

from voice_agent.backends.llm.llama_child import (
    MODEL_ALIAS,
    LlamaCommandLine,
    LlamaServerError,
    OmpWait,
    child_environment,
    child_setup,
    default_model_path,
    exited,
    find_llama_server,
    free_port,
    signal_group,
)
from voice_agent.backends.llm.llama_exits import ChildExit, what_to_try

# Re-exported: the service and its tests import them from here.
__all__ = [
    "MODEL_ALIAS",
    "EmbeddedLlamaServer",
    "LlamaServerError",
    "OmpWait",
    "child_environment",
    "default_model_path",
    "find_llama_server",
]

log = logging.getLogger(__name__)

# What the child prints once it listens: llama-server, and the Python
# servers some users run instead (uvicorn's line).
READY_MARKERS = (b": listening on http", b"Uvicorn running on")
SYSTEM_INFO_MARKER = "system_info:"
OUTPUT_TAIL_LINES = 8
CRASH_LOOP_DEATHS = 3
CRASH_LOOP_WINDOW_S = 60.0
MAX_BACKOFF_S = 30.0


class State(enum.StrEnum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    CRASH_LOOPING = "crash_looping"
    STOPPED = "stopped"


class ChildDied(LlamaServerError):
    def __init__(self, exit: ChildExit) -> None:
        super().__init__(exit.describe())
        self.exit = exit


class EmbeddedLlamaServer(LlamaCommandLine):
    def __init__(
        self,
        model_path: Path,
        threads: int,
        ctx: int,
        host: str = "127.0.0.1",
        start_timeout_s: float = 120.0,
        batch_threads: int | None = None,
        nice: int = 0,
        poll: int = 50,
        command: list[str] | None = None,
        probe_timeout_s: float = 60.0,
        restart_backoff_s: float = 1.0,
        binary: Path | None = None,
        parallel: int = 1,
        cache_ram_mb: int = 256,
        cache_reuse: int = 256,
        verbose: bool = False,
        omp_wait: OmpWait = "spin",
        kv_type: str = "f16",
    ) -> None:
        if command is None and not model_path.is_file():
            raise LlamaServerError(f"GGUF model not found: {model_path}")
        self.binary = binary
        self.parallel = parallel
        self.cache_ram_mb = cache_ram_mb
        self.cache_reuse = cache_reuse
        self.kv_type = kv_type
        self.verbose = verbose
        self.omp_wait = omp_wait
        self.system_info: str | None = None  # the build's CPU features, as it says
        self.model_path = model_path
        self.threads = threads
        self.batch_threads = batch_threads or threads
        self.nice = nice
        self.poll = poll
        self.ctx = ctx
        self.host = host
        self.port = 0
        self.start_timeout_s = start_timeout_s
        self.probe_timeout_s = probe_timeout_s
        self.restart_backoff_s = restart_backoff_s
        self._custom_command = command
        self._process: asyncio.subprocess.Process | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._stopping = False
        self._output: deque[str] = deque(maxlen=OUTPUT_TAIL_LINES)
        self.exits: deque[ChildExit] = deque(maxlen=20)
        self.state = State.STARTING
        self.restarts = 0
        self.deaths = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        """The server process's, while it runs."""
        return self._process.pid if self.running and self._process is not None else None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    @property
    def ready(self) -> bool:
        return self.state == State.READY and self.running

    def recent_deaths(self, window_s: float = CRASH_LOOP_WINDOW_S) -> list[ChildExit]:
        now = time.monotonic()
        return [e for e in self.exits if now - e.monotonic <= window_s]

    @property
    def unready_reason(self) -> str | None:
        """Why calls can't be served right now, in one line; None when ready."""
        if self.ready:
            return None
        if self.state == State.READY:  # died a moment ago; the supervisor is on it
            return "the embedded LLM (llama.cpp server) has just died; restarting"
        last = self.exits[-1] if self.exits else None
        if self.state == State.CRASH_LOOPING and last is not None:
            deaths = len(self.recent_deaths())
            return (
                f"the embedded LLM (llama.cpp server) is crash-looping: {deaths} deaths in the "
                f"last {CRASH_LOOP_WINDOW_S:.0f} s, the last {last.describe()} during "
                f"{last.during}"
            )
        if last is not None and self.state == State.RESTARTING:
            return f"the embedded LLM (llama.cpp server) {last.describe()}; restarting"
        return f"the embedded LLM (llama.cpp server) is {self.state.value}"

    def health(self) -> dict[str, Any]:
        """JSON-ready state for /readyz and /v1/stats."""
        return {
            "kind": "embedded",
            "state": self.state.value,
            "ready": self.ready,
            "reason": self.unready_reason,
            "restarts": self.restarts,
            "deaths": self.deaths,
            "deaths_last_minute": len(self.recent_deaths()),
            "last_exit": self.exits[-1].as_dict() if self.exits else None,
        }

    async def start(self, supervise: bool = True) -> None:
        """Launch the child and prove it can decode; a child that dies on its
        first request fails start-up here, with what to try. Without
        ``supervise``, restarts begin only at ``supervise()`` (after the
        caller's own warm-up, where a death must fail start-up too)."""
        try:
            await self._launch("start-up")
            await self._probe("warm-up")
        except ChildDied as exc:
            raise LlamaServerError(self.startup_failure(exc.exit)) from None
        self.state = State.READY
        log.info(
            "embedded llama.cpp server ready",
            extra={"base_url": self.base_url, "model": str(self.model_path)},
        )
        if supervise:
            self.supervise()

    def supervise(self) -> None:
        if self._supervisor is None:
            self._supervisor = asyncio.create_task(self._supervise(), name="llama-supervisor")

    async def exit_after_failure(self, during: str, wait_s: float = 5.0) -> ChildExit | None:
        """After a failed request before supervision: the child's exit if it
        died (recorded), or None if it is still alive."""
        process = self._process
        if process is None or self._supervisor is not None:
            return None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(wait_s):
                await process.wait()
        if process.returncode is None:
            return None
        await self._stop_drain()
        return self._record_exit(process, during)

    @staticmethod
    def startup_failure(exit: ChildExit) -> str:
        tail = " | ".join(exit.output_tail) or "(no output)"
        return (
            f"the embedded LLM (llama.cpp server) {exit.describe()} during {exit.during}; "
            f"its last output: {tail}; to try: {what_to_try(exit)}"
        )

    async def _launch(self, during: str) -> None:
        if not self.port:  # keep the port across restarts: clients hold the URL
            self.port = free_port(self.host)
        self._output.clear()
        process = await asyncio.create_subprocess_exec(
            *self._command(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=functools.partial(child_setup, self.nice),
            env=child_environment(self.omp_wait),
            # Its own process group: a signal to ours (Ctrl-C at a terminal,
            # `kill -- -PGID`, a supervisor that signals the group) is the
            # service's to handle; the service stops the child (and all it
            # started: _terminate) when done with it, and the death signal
            # covers the service dying outright. (systemd signals each
            # process of a control group: its units want KillMode=mixed.)
            process_group=0,
        )
        self._process = process
        assert process.stdout is not None
        try:
            async with asyncio.timeout(self.start_timeout_s):
                while True:
                    line = await process.stdout.readline()
                    if not line:
                        await process.wait()
                        raise ChildDied(self._record_exit(process, during))
                    self._keep(line)
                    if any(marker in line for marker in READY_MARKERS):
                        break
        except TimeoutError:
            await self._terminate(process)
            raise LlamaServerError(
                f"the embedded LLM (llama.cpp server) was not listening after "
                f"{self.start_timeout_s:.0f} s; its last output: {' | '.join(self._output)}"
            ) from None
        except BaseException:
            await self._terminate(process)
            raise
        # Keep draining its output so the pipe never fills and blocks it, and
        # so the last lines before a crash are at hand.
        self._drain_task = asyncio.create_task(self._drain(process), name="llama-output")
        log.debug(
            "embedded llama.cpp server listening",
            extra={"base_url": self.base_url, "model": str(self.model_path)},
        )

    def _keep(self, line: bytes) -> None:
        text = line.decode(errors="replace").rstrip()
        if SYSTEM_INFO_MARKER in text:
            self.system_info = text[text.index(SYSTEM_INFO_MARKER) :]
        if text:
            self._output.append(text[:300])

    async def _drain(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        while line := await process.stdout.readline():
            self._keep(line)
            log.debug("llama.cpp: %s", line.decode(errors="replace").rstrip())

    def _record_exit(self, process: asyncio.subprocess.Process, during: str) -> ChildExit:
        assert process.returncode is not None
        exit = ChildExit(
            time.monotonic(), time.time(), process.returncode, during, tuple(self._output)
        )
        self.exits.append(exit)
        self.deaths += 1
        return exit

    async def _probe(self, during: str) -> None:
        """One real one-token completion. A child that dies answering it is
        ChildDied; one that hangs is killed and counted as dead."""
        process = self._process
        assert process is not None
        body = {
            "model": MODEL_ALIAS,
            "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 1,
            "temperature": 0.0,
        }
        timeout = aiohttp.ClientTimeout(total=self.probe_timeout_s)
        try:
            async with (
                aiohttp.ClientSession(timeout=timeout) as http,
                http.post(f"{self.base_url}/chat/completions", json=body) as response,
            ):
                await response.read()
                if response.status < 500:
                    return
                problem = f"HTTP {response.status}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            problem = str(exc) or type(exc).__name__
        # Did it die answering? Its exit follows the broken connection closely.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):
                await process.wait()
        if process.returncode is None:
            self._output.append(f"(did not answer a one-token completion: {problem})")
            await self._terminate(process)
        await self._stop_drain()
        raise ChildDied(self._record_exit(process, during))

    async def _supervise(self) -> None:
        while not self._stopping:
            process = self._process
            assert process is not None
            await exited(process)
            await self._terminate(process)  # what it started would hold the port
            await self._stop_drain()
            await self._restart(self._record_exit(process, "serving"))

    async def _restart(self, exit: ChildExit) -> None:
        """Relaunch, with backoff, until a child answers its health check."""
        backoff = self.restart_backoff_s
        while not self._stopping:
            looping = len(self.recent_deaths()) >= CRASH_LOOP_DEATHS
            self.state = State.CRASH_LOOPING if looping else State.RESTARTING
            (log.critical if looping else log.error)(
                "embedded llama.cpp server died; restarting",
                extra={
                    "exit": exit.describe(),
                    "during": exit.during,
                    "output_tail": list(exit.output_tail),
                    "deaths_last_minute": len(self.recent_deaths()),
                    "backoff_s": backoff,
                },
            )
            await asyncio.sleep(backoff)  # restart backoff, not a polling loop
            backoff = min(backoff * 2, MAX_BACKOFF_S)
            try:
                await self._launch("start-up")
                await self._probe("health check")
            except ChildDied as exc:
                exit = exc.exit
                continue
            except Exception as exc:  # a timeout, a failed spawn: keep supervising
                log.error("restarting llama.cpp server failed", extra={"error": repr(exc)})
                continue
            self.restarts += 1
            self.state = State.READY
            log.info("embedded llama.cpp server healthy again", extra={"restarts": self.restarts})
            return

    async def _terminate(self, process: asyncio.subprocess.Process) -> None:
        """Stop the child and all it started: a --llama-server-command may be a
        wrapper whose own children the death signal does not reach."""
        if process.returncode is None:
            signal_group(process, signal.SIGTERM)
            try:
                async with asyncio.timeout(5):
                    await process.wait()
            except TimeoutError:
                signal_group(process, signal.SIGKILL)
                await process.wait()
        signal_group(process, signal.SIGKILL)  # whatever its leader left behind

    async def _stop_drain(self) -> None:
        """Wait for the output of a dead child (its last lines), then stop."""
        drain, self._drain_task = self._drain_task, None
        if drain is None:
            return
        with contextlib.suppress(TimeoutError, asyncio.CancelledError):
            async with asyncio.timeout(1):
                await asyncio.shield(drain)
        drain.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await drain

    async def stop(self) -> None:
        self._stopping = True
        self.state = State.STOPPED
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self._process is not None:
            await self._terminate(self._process)
        await self._stop_drain()
