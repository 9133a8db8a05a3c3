"""A WebSocket client that sends and never reads a byte: after the upgrade,
its socket's receive buffer (kept small) fills and the server's sends back
up in the kernel, as with a stalled or hostile client. aiohttp's client
cannot be one: it reads the socket as long as its own queue has room."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import socket
import struct
from pathlib import Path
from typing import Any


def _masked_text_frame(text: str) -> bytes:
    """One text frame as a client must send it (RFC 6455: masked)."""
    payload = text.encode()
    mask = os.urandom(4)
    size = len(payload)
    if size < 126:
        head = bytes([0x81, 0x80 | size])
    elif size < 1 << 16:
        head = bytes([0x81, 0x80 | 126]) + struct.pack(">H", size)
    else:
        head = bytes([0x81, 0x80 | 127]) + struct.pack(">Q", size)
    key = (mask * (size // 4 + 1))[:size]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(size, "big")
    return head + mask + masked


class SilentWebSocket:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock

    @classmethod
    async def connect(cls, url: str, path: str = "/v1/realtime?model=default") -> SilentWebSocket:
        host, port = url.removeprefix("http://").split(":")
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        try:
            await loop.sock_connect(sock, (host, int(port)))
            key = base64.b64encode(os.urandom(16)).decode()
            request = (
                f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: realtime\r\n\r\n"
            )
            await loop.sock_sendall(sock, request.encode())
            # The answer's head, and whatever came with it: the last bytes read.
            answer = await asyncio.wait_for(loop.sock_recv(sock, 1024), 30)
        except BaseException:
            sock.close()
            raise
        if not answer.startswith(b"HTTP/1.1 101"):
            sock.close()
            raise AssertionError(f"no upgrade: {answer[:200]!r}")
        return cls(sock)

    @property
    def local_port(self) -> int:
        return int(self._sock.getsockname()[1])

    async def send(self, event: dict[str, Any], timeout_s: float = 10) -> bool:
        """Send ``event``; False when the server has stopped taking bytes
        (or the connection is gone) for ``timeout_s``."""
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(
                loop.sock_sendall(self._sock, _masked_text_frame(json.dumps(event))), timeout_s
            )
        except (TimeoutError, OSError):
            return False
        return True

    def close(self) -> None:
        self._sock.close()


def holds_connection_from(pid: int, client_port: int) -> bool:
    """Whether process ``pid`` still has a TCP socket connected to
    ``client_port`` (one the kernel finishes on its own, with no process
    holding it, is not)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # closed meanwhile
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            # remote address as HEX_IP:HEX_PORT; the inode is the tenth field
            if int(fields[2].rsplit(":", 1)[1], 16) == client_port and fields[9] in inodes:
                return True
    return False


async def let_go_of(pid: int, client_port: int, within_s: float) -> bool:
    """Whether process ``pid`` lets go of its connection to ``client_port``
    within ``within_s`` (checked every 50 ms: another process's sockets
    have no event to wait on)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while holds_connection_from(pid, client_port):
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True
