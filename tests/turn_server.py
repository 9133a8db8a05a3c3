"""A real coturn TURN server on loopback for one test, in the TURN REST API
mode (``use-auth-secret``) the service mints credentials for: ``coturn()``
with permissive test flags, ``shipped_coturn()`` as deploy/coturn/ runs it.
``TurnClient`` speaks TURN to either and reports every answer, refusals
included (aioice's client raises on the first error and hides its code)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import socket
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from aioice import stun

from voice_agent.testing.ports import free_port

SHIPPED = Path(__file__).resolve().parents[1] / "deploy" / "coturn"

# coturn prints this once its relay threads are started, which is not yet
# listening: each thread binds its TCP listener on its own (_answering).
READY_LINE = b"Total General servers"

# REQUESTED-TRANSPORT (RFC 5766): the protocol number in the top byte.
UDP = 17 << 24
TCP = 6 << 24

# aioice's STUN codec lacks REQUESTED-ADDRESS-FAMILY (RFC 6156), the one way
# to ask coturn for an IPv6 relay; its value is the family in the top byte.
_ADDRESS_FAMILY = (0x0017, "REQUESTED-ADDRESS-FAMILY", stun.pack_unsigned, stun.unpack_unsigned)
stun.ATTRIBUTES_BY_TYPE.setdefault(_ADDRESS_FAMILY[0], _ADDRESS_FAMILY)
stun.ATTRIBUTES_BY_NAME.setdefault(_ADDRESS_FAMILY[1], _ADDRESS_FAMILY)
IPV6 = 2 << 24


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
async def _running(
    command: Sequence[str], port: int, env: Mapping[str, str] | None = None
) -> AsyncIterator[None]:
    """``command`` (a turnserver) running until the block ends, from the
    moment it answers on ``port``."""
    process = await asyncio.create_subprocess_exec(
        *command,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=None if env is None else dict(env),
    )
    assert process.stdout is not None
    output = bytearray()
    drain: asyncio.Task[bytes] | None = None
    try:
        try:
            async with asyncio.timeout(20):
                while READY_LINE not in output:
                    line = await process.stdout.readline()
                    if not line:
                        raise RuntimeError(f"turnserver exited: {output.decode(errors='replace')}")
                    output += line
                # Keep reading its log so a full pipe never blocks it.
                drain = asyncio.create_task(process.stdout.read())
                await _answering(port)
        except TimeoutError:
            raise RuntimeError(
                f"turnserver did not answer on port {port} within 20 s: "
                + output.decode(errors="replace")
            ) from None
        yield
    finally:
        if process.returncode is None:
            process.terminate()
        async with asyncio.timeout(10):
            await process.wait()
        if drain is not None:
            drain.cancel()


async def _answering(port: int) -> None:
    """Until a STUN Binding request to ``port`` on loopback gets an answer
    over UDP and over TCP. coturn's relay threads bind their listeners on
    their own after it logs that it is ready, and keep retrying a TCP
    listener they cannot bind without saying so on stdout."""
    server = ("127.0.0.1", port)
    transport: Literal["udp", "tcp"]
    for transport in ("udp", "tcp"):
        while True:
            try:
                async with TurnClient.connect(server, "", "", transport) as client:
                    await client.binding(timeout_s=0.2)
                break
            except (OSError, TimeoutError):
                await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def coturn(secret: str = "test-turn-secret") -> AsyncIterator[TurnServer]:
    binary = require_coturn()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="coturn-") as state:
        async with _running(
            (
                *(binary, "-n", "--log-file=stdout", "--simple-log", "--no-cli", "--no-tls"),
                *("--no-dtls", "--fingerprint", f"--listening-port={port}"),
                *("--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1"),
                # Relays to the server's loopback host candidates (a test-only setting).
                "--allow-loopback-peers",
                *("--use-auth-secret", f"--static-auth-secret={secret}"),
                *("--realm=voice-agent.test", f"--db={state}/turndb", f"--pidfile={state}/pid"),
            ),
            port,
        ):
            yield TurnServer(secret, port)


def has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


@contextlib.asynccontextmanager
async def shipped_coturn(
    allowed_peers: Sequence[str], secret: str = "test-turn-secret-0123456789"
) -> AsyncIterator[TurnServer]:
    """coturn started the way deploy/ starts it (deploy/coturn/start.sh, the
    shipped turnserver.conf, the secret read from a file). Only what every
    deployment sets for itself is the test's: loopback listening and relay
    addresses (::1 too where there is one), a free port, the allowed peers,
    and --allow-loopback-peers, which lets 127.0.0.1 stand in for the voice
    agent's address (the rest of loopback stays denied by the shipped list)."""
    require_coturn()
    port = free_port()
    relay_ips = ["127.0.0.1", *(["::1"] if has_ipv6_loopback() else [])]
    with tempfile.TemporaryDirectory(prefix="coturn-") as state:
        secret_file = Path(state) / "turn-secret"
        secret_file.write_text(secret + "\n")
        env = {
            **os.environ,
            "TURN_SECRET_FILE": str(secret_file),
            "TURN_ALLOWED_PEER_IP": " ".join(allowed_peers),
            "TURN_RUNTIME_DIR": state,
        }
        env.pop("TURN_SECRET", None)
        async with _running(
            (
                *("/bin/sh", str(SHIPPED / "start.sh"), "--listening-ip=127.0.0.1"),
                *(f"--listening-port={port}", *(f"--relay-ip={ip}" for ip in relay_ips)),
                *("--realm=voice-agent.test", "--allow-loopback-peers"),
                *(f"--db={state}/turndb", f"--pidfile={state}/pid"),
            ),
            port,
            env,
        ):
            yield TurnServer(secret, port)


# --- a TURN client that shows what the server answered ------------------------


class TurnError(Exception):
    def __init__(self, response: stun.Message) -> None:
        code, reason = response.attributes["ERROR-CODE"]
        self.code: int = code
        self.reason: str = reason
        super().__init__(f"{response.message_method.name}: {self.code} {self.reason}")


class _Datagrams(asyncio.DatagramProtocol):
    def __init__(self, queue: asyncio.Queue[bytes]) -> None:
        self.queue = queue

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.queue.put_nowait(data)


class TurnClient:
    """One client connection to a TURN server over UDP or TCP, holding (at
    most) one allocation, authenticated with a long-term credential."""

    def __init__(self, username: str, password: str) -> None:
        self.username = username
        self.password = password
        self.realm = ""
        self.nonce = b""
        self.relayed: tuple[str, int] | None = None
        self.lifetime: int | None = None
        self._incoming: asyncio.Queue[bytes] = asyncio.Queue()
        self._waiting: dict[bytes, asyncio.Future[stun.Message]] = {}
        self.data: asyncio.Queue[tuple[tuple[str, int], bytes]] = asyncio.Queue()
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls,
        server: tuple[str, int],
        username: str,
        password: str,
        transport: Literal["udp", "tcp"] = "udp",
    ) -> AsyncIterator[TurnClient]:
        client = cls(username, password)
        loop = asyncio.get_running_loop()
        if transport == "udp":
            client._udp, _ = await loop.create_datagram_endpoint(
                lambda: _Datagrams(client._incoming), remote_addr=server
            )
            client._reader_task = asyncio.create_task(client._read_datagrams())
        else:
            reader, client._tcp = await asyncio.open_connection(*server)
            client._reader_task = asyncio.create_task(client._read_stream(reader))
        try:
            yield client
        finally:
            await client._release()
            client._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await client._reader_task
            if client._udp is not None:
                client._udp.close()
            if client._tcp is not None:
                client._tcp.close()
                with contextlib.suppress(ConnectionError):
                    await client._tcp.wait_closed()

    # -- the wire ----------------------------------------------------------
    def _write(self, message: stun.Message) -> None:
        if self._udp is not None:
            self._udp.sendto(bytes(message))
        else:
            assert self._tcp is not None
            self._tcp.write(bytes(message))

    async def _read_datagrams(self) -> None:
        while True:
            self._dispatch(await self._incoming.get())

    async def _read_stream(self, reader: asyncio.StreamReader) -> None:
        # Over TCP, STUN messages follow each other, each 20 bytes of header
        # whose bytes 2-3 give the length of the rest.
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                header = await reader.readexactly(stun.HEADER_LENGTH)
                length = int.from_bytes(header[2:4], "big")
                self._dispatch(header + await reader.readexactly(length))
        for waiting in self._waiting.values():
            if not waiting.done():
                waiting.set_exception(ConnectionError("the TURN server closed the connection"))

    def _dispatch(self, data: bytes) -> None:
        message = stun.parse_message(data)
        if message.message_method == stun.Method.DATA:
            self.data.put_nowait(
                (message.attributes["XOR-PEER-ADDRESS"], message.attributes["DATA"])
            )
            return
        waiting = self._waiting.pop(message.transaction_id, None)
        if waiting is not None and not waiting.done():
            waiting.set_result(message)

    async def _exchange(self, request: stun.Message, timeout_s: float = 5) -> stun.Message:
        waiting: asyncio.Future[stun.Message] = asyncio.get_running_loop().create_future()
        self._waiting[request.transaction_id] = waiting
        self._write(request)
        try:
            return await asyncio.wait_for(waiting, timeout_s)
        finally:
            self._waiting.pop(request.transaction_id, None)

    async def binding(self, timeout_s: float = 5) -> stun.Message:
        """The server's answer to a STUN Binding request (no credentials)."""
        request = stun.Message(stun.Method.BINDING, stun.Class.REQUEST)
        request.add_fingerprint()
        return await self._exchange(request, timeout_s)

    # -- requests --------------------------------------------------------------
    def _key(self) -> bytes:
        # The long-term credential key (RFC 5389 section 15.4).
        return hashlib.md5(f"{self.username}:{self.realm}:{self.password}".encode()).digest()

    async def request(self, method: stun.Method, attributes: dict[str, Any]) -> stun.Message:
        """``method`` with ``attributes``, authenticated (after learning the
        realm and nonce from the server's first 401 or a 438 stale nonce):
        the success answer, or TurnError with the server's code."""
        for _ in range(3):
            request = stun.Message(method, stun.Class.REQUEST, attributes=dict(attributes))
            if self.nonce:
                request.attributes.update(
                    USERNAME=self.username, REALM=self.realm, NONCE=self.nonce
                )
                request.add_message_integrity(self._key())
            else:
                request.add_fingerprint()
            response = await self._exchange(request)
            if response.message_class == stun.Class.RESPONSE:
                return response
            if response.error_code in (401, 438) and "NONCE" in response.attributes:
                stale = response.error_code == 438 or not self.nonce
                self.realm = response.attributes.get("REALM", self.realm)
                self.nonce = response.attributes["NONCE"]
                if stale:
                    continue
            raise TurnError(response)
        raise TurnError(response)

    async def allocate(
        self, transport: int = UDP, family: int | None = None, lifetime: int | None = None
    ) -> tuple[str, int]:
        """A relay: its address (XOR-RELAYED-ADDRESS)."""
        attributes: dict[str, Any] = {"REQUESTED-TRANSPORT": transport}
        if family is not None:
            attributes["REQUESTED-ADDRESS-FAMILY"] = family
        if lifetime is not None:
            attributes["LIFETIME"] = lifetime
        response = await self.request(stun.Method.ALLOCATE, attributes)
        self.relayed = response.attributes["XOR-RELAYED-ADDRESS"]
        self.lifetime = response.attributes.get("LIFETIME")
        return self.relayed

    async def _release(self) -> None:
        # A UDP allocation outlives its socket (until its lifetime ends) and
        # counts against the quotas meanwhile: give it back.
        if self.relayed is not None:
            with contextlib.suppress(TurnError, TimeoutError, ConnectionError):
                await self.request(stun.Method.REFRESH, {"LIFETIME": 0})
            self.relayed = None

    async def create_permission(self, peer_ip: str) -> None:
        await self.request(stun.Method.CREATE_PERMISSION, {"XOR-PEER-ADDRESS": (peer_ip, 0)})

    async def channel_bind(self, peer: tuple[str, int], channel: int = 0x4000) -> None:
        attributes = {"CHANNEL-NUMBER": channel, "XOR-PEER-ADDRESS": peer}
        await self.request(stun.Method.CHANNEL_BIND, attributes)

    def send(self, peer: tuple[str, int], data: bytes) -> None:
        """A Send indication: no answer comes, refused or not."""
        indication = stun.Message(
            stun.Method.SEND,
            stun.Class.INDICATION,
            attributes={"XOR-PEER-ADDRESS": peer, "DATA": data},
        )
        indication.add_fingerprint()
        self._write(indication)
