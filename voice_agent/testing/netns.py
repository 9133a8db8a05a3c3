"""A private network namespace for tests and benchmarks, with its own
loopback addresses.

Processes run inside it through ``ip netns exec``. The test process itself
stays outside (its engine and other fixtures keep their sockets), but can
make sockets inside: network namespaces are per thread in Linux, and a
socket stays in the namespace it was made in. One thread enters the
namespace for good and makes every socket the tests need there: listening
sockets for servers run on this event loop, and client connections
(``connector()`` gives aiohttp one that connects from inside).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import os
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import aiohttp

CLONE_NEWNET = 0x40000000
T = TypeVar("T")


def missing_for_namespaces() -> str | None:
    """Why namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "needs root (to create a network namespace)"
    if shutil.which("ip") is None:
        return "needs the ip tool (iproute2)"
    return None


class NetworkNamespace:
    def __init__(self, name: str, addresses: Sequence[str]) -> None:
        self.name = name
        self.addresses = list(addresses)
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"netns-{name}")

    # -- life ------------------------------------------------------------
    def create(self) -> None:
        self._remove()  # one left by a test run that was killed
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        self.run("ip", "link", "set", "lo", "up")
        for address in self.addresses:
            self.run("ip", "addr", "add", f"{address}/32", "dev", "lo")
        self._thread.submit(self._enter).result()

    def _enter(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        with open(f"/var/run/netns/{self.name}") as handle:
            if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns failed")

    def delete(self) -> None:
        """Remove the namespace (its processes must be gone first)."""
        self._thread.shutdown(wait=True)
        self._remove()

    def _remove(self) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], capture_output=True, check=False)

    def pids(self) -> list[int]:
        """Every process still running inside."""
        listed = subprocess.run(
            ["ip", "netns", "pids", self.name], capture_output=True, text=True, check=False
        )
        return [int(pid) for pid in listed.stdout.split()]

    # -- processes ----------------------------------------------------------
    def command(self, *args: str) -> list[str]:
        return ["ip", "netns", "exec", self.name, *args]

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.command(*args), capture_output=True, text=True, check=True)

    def call(self, function: Callable[..., T], *args: Any) -> T:
        """Run a blocking ``function`` from inside (its sockets are made there)."""
        return self._thread.submit(function, *args).result()

    # -- sockets ---------------------------------------------------------------
    def new_socket(self, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A new IPv4 socket inside the namespace."""
        return self._thread.submit(socket.socket, socket.AF_INET, kind).result()

    def listener(self, host: str, port: int = 0) -> socket.socket:
        sock = self.new_socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
        return sock

    def connector(self) -> aiohttp.TCPConnector:
        """aiohttp connections made from inside the namespace."""

        def make(addr_info: Any) -> socket.socket:
            family, kind, proto = addr_info[0], addr_info[1], addr_info[2]
            return self._thread.submit(socket.socket, family, kind, proto).result()

        return aiohttp.TCPConnector(socket_factory=make, force_close=True)

    async def open_connection(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = self.new_socket()
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        return await asyncio.open_connection(sock=sock)


@contextmanager
def network_namespace(name: str, addresses: Sequence[str]) -> Iterator[NetworkNamespace]:
    namespace = NetworkNamespace(name, addresses)
    namespace.create()
    try:
        yield namespace
    finally:
        namespace.delete()
