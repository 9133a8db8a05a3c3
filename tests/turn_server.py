"""A real coturn TURN server on loopback for one test, in the TURN REST API
mode (``use-auth-secret``) the service mints credentials for."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest

from tests.ports import free_port

# coturn prints this once its listeners and relay threads are up.
READY_LINE = b"Total General servers"


@dataclass(frozen=True)
class TurnServer:
    secret: str
    port: int

    @property
    def url(self) -> str:
        return f"turn:127.0.0.1:{self.port}?transport=udp"


def require_coturn() -> str:
    binary = shutil.which("turnserver")
    if binary is None:
        pytest.skip("coturn's turnserver is not installed (apt-get install coturn)")
    return binary


@contextlib.asynccontextmanager
async def coturn(secret: str = "test-turn-secret") -> AsyncIterator[TurnServer]:
    binary = require_coturn()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="coturn-") as state:
        process = await asyncio.create_subprocess_exec(
            *(binary, "-n", "--log-file=stdout", "--simple-log", "--no-cli", "--no-tls"),
            *("--no-dtls", "--fingerprint", f"--listening-port={port}"),
            *("--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1"),
            # Relays to the server's loopback host candidates (a test-only setting).
            "--allow-loopback-peers",
            *("--use-auth-secret", f"--static-auth-secret={secret}", "--realm=voice-agent.test"),
            f"--db={state}/turndb",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert process.stdout is not None
        output = bytearray()
        drain: asyncio.Task[bytes] | None = None
        try:
            async with asyncio.timeout(20):
                while READY_LINE not in output:
                    line = await process.stdout.readline()
                    if not line:
                        raise RuntimeError(f"turnserver exited: {output.decode(errors='replace')}")
                    output += line
            # Keep reading its log so a full pipe never blocks it.
            drain = asyncio.create_task(process.stdout.read())
            yield TurnServer(secret, port)
        finally:
            if process.returncode is None:
                process.terminate()
            async with asyncio.timeout(10):
                await process.wait()
            if drain is not None:
                drain.cancel()
