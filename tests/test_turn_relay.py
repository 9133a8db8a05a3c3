"""The TURN relay deploy/ ships (deploy/coturn/: turnserver.conf, start.sh)
against a real coturn, with credentials minted as the service mints them.

Every caller gets such a credential, so the relay must reach the voice
agent and the public internet (callers), never what sits behind the host:
private and link-local networks, cloud metadata, loopback. Here 127.0.0.1
stands in for the voice agent's address (the one allowed peer; allowed-peer-ip
wins over the denied 127/8 range, as a private host address wins over
10/8 in production), and real UDP sockets on it and on 127.0.0.2 show what
is delivered and what is not."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Iterator

import pytest
import pytest_asyncio

from tests.turn_server import (
    IPV6,
    SHIPPED,
    TCP,
    TurnClient,
    TurnError,
    TurnServer,
    has_ipv6_loopback,
    shipped_coturn,
)
from voice_agent.rtc.turn import TurnCredential, mint

# The voice agent's address, for this test.
AGENT = "127.0.0.1"

# Peers no caller may reach through the relay: this host's loopback, private
# networks (RFC 1918, carrier-grade NAT), link-local and cloud metadata,
# "this network", IETF and benchmarking ranges, multicast, reserved and
# broadcast.
DENIED_IPV4 = [
    "127.0.0.2",
    "127.0.0.53",
    "0.0.0.0",
    "0.1.2.3",
    "10.0.0.1",
    "100.64.0.1",
    "169.254.169.254",
    "172.16.0.1",
    "172.31.255.254",
    "192.0.0.1",
    "192.168.1.1",
    "198.18.0.1",
    "224.0.0.1",
    "239.255.255.250",
    "240.0.0.1",
    "255.255.255.255",
]
# The same in IPv6, and IPv4 again written as IPv6 (mapped, compatible,
# NAT64, 6to4).
DENIED_IPV6 = [
    "::1",
    "::",
    "fd00::1",
    "fc00::1",
    "fe80::1",
    "fec0::1",
    "ff02::1",
    "::ffff:127.0.0.1",
    "::ffff:0.0.0.0",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "::10.0.0.1",
    "::0.0.1.0",
    "64:ff9b::a9fe:a9fe",
    "2002:a00:1::",
]
# A caller on the internet (documentation addresses: nothing is sent).
PUBLIC_IPV4 = "203.0.113.7"
PUBLIC_IPV6 = "2001:db8::7"


def shipped_setting(name: str) -> int:
    """A number from the shipped turnserver.conf."""
    for line in (SHIPPED / "turnserver.conf").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == name:
            return int(value)
    raise AssertionError(f"{name} is not in the shipped turnserver.conf")


@pytest_asyncio.fixture
async def turn() -> AsyncIterator[TurnServer]:
    async with shipped_coturn(allowed_peers=[AGENT]) as server:
        yield server


def credential(turn: TurnServer, name: str) -> TurnCredential:
    # What GET /v1/ice-servers hands a caller (the service's default lifetime).
    return mint(turn.secret, name, ttl_s=7200)


def udp_socket(address: str) -> Iterator[socket.socket]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((address, 0))
        sock.setblocking(False)
        yield sock


@pytest.fixture
def agent_socket() -> Iterator[socket.socket]:
    """The voice agent's media port."""
    yield from udp_socket(AGENT)


@pytest.fixture
def hidden_socket() -> Iterator[socket.socket]:
    """A UDP service on this host's loopback (a DNS cache, say)."""
    yield from udp_socket("127.0.0.2")


async def answer(attempt: Awaitable[object]) -> int:
    """The code a TURN request was answered with: 200, or the error's."""
    try:
        await attempt
    except TurnError as error:
        return error.code
    return 200


async def test_the_relay_reaches_the_voice_agent_and_no_private_or_loopback_peer(
    turn: TurnServer, agent_socket: socket.socket, hidden_socket: socket.socket
) -> None:
    minted = credential(turn, "caller")
    loop = asyncio.get_running_loop()
    async with TurnClient.connect(
        ("127.0.0.1", turn.port), minted.username, minted.credential
    ) as client:
        relayed = await client.allocate()

        # Every private, loopback, link-local, multicast and reserved peer:
        # 403 Forbidden IP, for a permission and for a channel.
        codes = {ip: await answer(client.create_permission(ip)) for ip in DENIED_IPV4}
        assert codes == {ip: 403 for ip in DENIED_IPV4}
        assert await answer(client.channel_bind(("169.254.169.254", 80))) == 403
        assert await answer(client.channel_bind(("127.0.0.2", 53))) == 403

        # A caller on the internet is a peer (the voice agent's own relay
        # allocation sends to callers).
        await client.create_permission(PUBLIC_IPV4)

        # Data for a loopback port that a real socket listens on is dropped;
        # data for the voice agent, sent after it, arrives from the relay.
        hidden = hidden_socket.getsockname()
        client.send(hidden, b"to a loopback service")
        await client.create_permission(AGENT)
        client.send(agent_socket.getsockname(), b"to the voice agent")
        data, source = await asyncio.wait_for(loop.sock_recvfrom(agent_socket, 2048), 5)
        assert (data, source) == (b"to the voice agent", relayed)
        # The relay handles one client's messages in order: the loopback one
        # was dealt with before the voice agent's arrived.
        await asyncio.sleep(0.2)
        with pytest.raises(BlockingIOError):
            hidden_socket.recvfrom(2048)

        # And the voice agent's answer comes back to the caller.
        await loop.sock_sendto(agent_socket, b"from the voice agent", relayed)
        peer, reply = await asyncio.wait_for(client.data.get(), 5)
        assert (peer, reply) == (agent_socket.getsockname(), b"from the voice agent")


@pytest.mark.skipif(not has_ipv6_loopback(), reason="needs IPv6 (::1) for an IPv6 relay")
async def test_an_ipv6_relay_reaches_no_private_loopback_or_mapped_ipv4_peer(
    turn: TurnServer,
) -> None:
    minted = credential(turn, "caller6")
    async with TurnClient.connect(
        ("127.0.0.1", turn.port), minted.username, minted.credential
    ) as client:
        relayed = await client.allocate(family=IPV6)
        assert ":" in relayed[0]
        codes = {ip: await answer(client.create_permission(ip)) for ip in DENIED_IPV6}
        assert codes == {ip: 403 for ip in DENIED_IPV6}
        await client.create_permission(PUBLIC_IPV6)


async def test_tcp_relays_are_refused_while_turn_over_tcp_still_works(turn: TurnServer) -> None:
    minted = credential(turn, "caller-tcp")
    server = ("127.0.0.1", turn.port)
    # RFC 6062: a relay that opens TCP connections to peers. 442 Unsupported
    # Transport Protocol.
    async with TurnClient.connect(server, minted.username, minted.credential, "tcp") as client:
        assert await answer(client.allocate(transport=TCP)) == 442
    # Callers are handed a transport=tcp URL: TURN over TCP to a UDP relay.
    async with TurnClient.connect(server, minted.username, minted.credential, "tcp") as client:
        await client.allocate()
        await client.create_permission(AGENT)


async def test_one_credential_holds_a_bounded_number_of_short_lived_relays(
    turn: TurnServer,
) -> None:
    quota = shipped_setting("user-quota")
    longest = shipped_setting("max-allocate-lifetime")
    assert 2 <= quota <= 50
    minted = credential(turn, "greedy")
    server = ("127.0.0.1", turn.port)
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(
                TurnClient.connect(server, minted.username, minted.credential)
            )
            for _ in range(quota + 1)
        ]
        for client in clients[:quota]:
            await client.allocate(lifetime=24 * 3600)
            # Asked for a day, granted at most the shipped maximum.
            assert client.lifetime is not None and client.lifetime <= longest
        # 486 Allocation Quota Reached.
        assert await answer(clients[quota].allocate()) == 486
        # Another caller's credential is not affected, nor another credential
        # of the same key: coturn counts the quota on the name after the
        # expiry, so a name shared by a key's credentials let one caller lock
        # out the key's others (with auth off, everyone).
        for other in (credential(turn, "other"), credential(turn, "greedy")):
            async with TurnClient.connect(server, other.username, other.credential) as client:
                await client.allocate()
