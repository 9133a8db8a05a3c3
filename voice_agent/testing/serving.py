"""``voice-agent serve`` in a process of its own, for a test or a benchmark
that needs the real command (its start-up, its signals, its workers), and
waiting until it is ready."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import weakref
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path

import aiohttp

from voice_agent.testing.ports import free_port

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# Each server started here by its URL, so wait_ready can tell a server that
# exited (a bad flag, a failed model) at once instead of at its timeout.
_STARTED: weakref.WeakValueDictionary[str, asyncio.subprocess.Process] = (
    weakref.WeakValueDictionary()
)


async def start_server(
    *flags: str,
    env: dict[str, str] | None = None,
    own_process_group: bool = False,
    python: str | None = None,
    cpus: set[int] | None = None,
) -> tuple[asyncio.subprocess.Process, str]:
    """The server process (embedded models, loopback media) and its URL;
    ``env`` adds to (or overrides) this process's environment; with
    ``own_process_group`` it leads a process group of its own, to be
    signalled whole as a terminal or a service manager does; ``python``:
    another interpreter (another build's) instead of this one; ``cpus``:
    the cores it (and every process it starts) may run on, as ``taskset``
    would pin it, set before it runs a line so its defaults see them."""
    port = free_port()

    def before_exec() -> None:
        if cpus is not None:
            os.sched_setaffinity(0, cpus)
        # A bench or test killed outright (SIGTERM, SIGKILL) runs no cleanup:
        # the server it started is told then, as by a terminal's hang-up, and
        # stops its own children on the way out.
        _stop_with_parent()

    process = await asyncio.create_subprocess_exec(
        # -P: another build's interpreter imports its own checkout, not the
        # voice_agent/ of the directory this runs in.
        *(python or sys.executable, "-P", "-m", "voice_agent", "serve", "--port", str(port)),
        *("--ice-host-addresses", "127.0.0.1", "--log-level", "WARNING"),
        *flags,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        # And in its own interpreter's directory: an older front starts its
        # media workers with the working directory first on their path,
        # where this checkout's voice_agent/ would go ahead of its own.
        cwd=None if python is None else str(Path(python).parent),
        process_group=0 if own_process_group else None,
        preexec_fn=before_exec,
    )
    url = f"http://127.0.0.1:{port}"
    _STARTED[url] = process
    return process, url


def _prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL(None).prctl
    except (OSError, AttributeError):  # not Linux
        return None


# Looked up here, not in the forked child, which should do as little as it
# can before exec (the parent has threads).
_PRCTL = _prctl()


def _stop_with_parent() -> None:
    """SIGTERM to this forked process when its parent dies (Linux's
    PR_SET_PDEATHSIG; elsewhere nothing)."""
    if _PRCTL is not None:
        _PRCTL(PR_SET_PDEATHSIG, int(signal.SIGTERM))


async def wait_ready(http: aiohttp.ClientSession, url: str, timeout_s: float = 180) -> None:
    """Until the server at ``url`` answers ``/readyz`` with 200 (its models
    loaded), for at most ``timeout_s``; a server started by start_server
    that exits first is an error at once."""
    async with asyncio.timeout(timeout_s):
        while True:
            process = _STARTED.get(url)
            if process is not None and process.returncode is not None:
                raise RuntimeError(f"the server at {url} exited ({process.returncode}) unready")
            try:
                async with http.get(url + "/readyz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.25)  # the server is booting: not on any media path


@contextlib.asynccontextmanager
async def servers_side_by_side(
    arms: Mapping[str, Sequence[str]],
    *shared_flags: str,
    pythons: Mapping[str, str] | None = None,
) -> AsyncIterator[dict[str, str]]:
    """One server process per arm (its flags, then ``shared_flags``; run by
    ``pythons[arm]`` where given: another build), all ready; their URLs by
    arm. Every one is stopped on the way out."""
    servers: dict[str, tuple[asyncio.subprocess.Process, str]] = {}
    try:
        for arm, flags in arms.items():
            python = (pythons or {}).get(arm)
            servers[arm] = await start_server(*flags, *shared_flags, python=python)
        async with aiohttp.ClientSession() as http:
            for _, url in servers.values():
                await wait_ready(http, url)
        yield {arm: url for arm, (_, url) in servers.items()}
    finally:
        for process, _ in servers.values():
            process.send_signal(signal.SIGINT)
            await process.wait()
