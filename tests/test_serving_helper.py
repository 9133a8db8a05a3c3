"""``voice_agent.testing.serving``: a server a bench or test started stops
when that bench or test is killed outright, running no cleanup of its own
(real processes)."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap

import aiohttp
import pytest

from voice_agent.testing.serving import start_server, wait_ready

STARTS_A_SERVER = textwrap.dedent(
    """
    import asyncio
    from voice_agent.testing.serving import start_server

    async def main():
        process, _ = await start_server(
            "--llm-base-url", "http://127.0.0.1:9/v1", "--workers", "0",
            "--vad", "webrtc", "--turn-backend", "silence",
        )
        print(process.pid, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
    """
)


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its parent) is not running
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_a_server_outlives_no_bench_killed_with_sigkill() -> None:
    bench = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STARTS_A_SERVER, stdout=asyncio.subprocess.PIPE
    )
    assert bench.stdout is not None
    server = int((await asyncio.wait_for(bench.stdout.readline(), 60)).decode())
    assert running(server)
    exited = asyncio.Event()  # a pidfd reads ready once its process has exited
    pidfd = os.pidfd_open(server)
    asyncio.get_running_loop().add_reader(pidfd, exited.set)
    bench.kill()  # SIGKILL: no finally, no atexit
    # (The bench's wait ends when its output pipe closes, which the server,
    # sharing it, holds open for as long as it runs.)
    try:
        async with asyncio.timeout(60):  # the server's graceful stop
            await bench.wait()
            await exited.wait()
    finally:
        asyncio.get_running_loop().remove_reader(pidfd)
        os.close(pidfd)
    assert not running(server)


async def test_another_builds_server_runs_in_its_interpreters_directory() -> None:
    # Not in this checkout, whose voice_agent/ would go ahead of that
    # build's own in an older front's media workers.
    process, _ = await start_server(
        "--llm-base-url", "http://127.0.0.1:9/v1", "--vad", "webrtc", python=sys.executable
    )
    try:
        cwd = os.readlink(f"/proc/{process.pid}/cwd")
    finally:
        process.kill()
        await process.wait()
    assert cwd == os.path.dirname(sys.executable)


async def test_waiting_for_a_server_that_exited_fails_at_once() -> None:
    """A server that cannot start (here: a flag value it refuses) is
    reported as soon as it exits, not when the wait's timeout runs out."""
    process, url = await start_server("--workers", "-1")
    async with aiohttp.ClientSession() as http:
        with pytest.raises(RuntimeError, match=r"exited \(2\) unready"):
            await wait_ready(http, url, timeout_s=120)
    assert await process.wait() == 2  # (the timeout would raise TimeoutError)
