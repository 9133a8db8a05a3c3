"""Local ports for tests and benchmarks."""

from __future__ import annotations

import random
import socket
from pathlib import Path

# Linux's default ephemeral range, for where /proc does not say.
_DEFAULT_EPHEMERAL = (32768, 60999)
_LOWEST = 10000
_handed_out: set[int] = set()
# Its own generator: a test that seeds the global one gets the same ports in
# every run, and so does every process that runs it at once.
_RANDOM = random.Random()


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return _DEFAULT_EPHEMERAL


def _bindable(port: int) -> bool:
    """Nothing holds ``port``, TCP or UDP, on any local address: binding the
    wildcard address fails while any socket has the port on a single one."""
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            try:
                sock.bind(("", port))
            except OSError:
                return False
    return True


def free_port() -> int:
    """A local port nothing holds, TCP or UDP (at the time of asking), for a
    server the caller is about to start.

    It is taken from below the kernel's ephemeral range. A port from inside
    it (what binding port 0 gives) is one the kernel may hand to any outgoing
    connection or ICE socket in the moments before the server binds it, and
    then the server fails to listen: coturn, for one, logs that it is ready
    and keeps retrying its TCP listener in the background. Ports already
    handed out in this process are not handed out again."""
    low, _ = _ephemeral_range()
    candidates = _RANDOM.sample(range(_LOWEST, low), 200) if low - _LOWEST >= 1000 else []
    for port in candidates:
        if port not in _handed_out and _bindable(port):
            _handed_out.add(port)
            return port
    # No room below the range (a host that starts it low): the kernel's pick.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
