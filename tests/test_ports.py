"""The ports tests and benchmarks start servers on."""

from __future__ import annotations

import socket

import pytest

from voice_agent.testing import ports as ports_module
from voice_agent.testing.ports import _ephemeral_range, free_port


def test_a_free_port_is_outside_the_range_the_kernel_hands_to_clients() -> None:
    low, high = _ephemeral_range()
    # An outgoing connection takes its local port from the ephemeral range.
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        socket.create_connection(server.getsockname()) as client,
    ):
        assert low <= client.getsockname()[1] <= high
    ports = [free_port() for _ in range(20)]
    assert all(not low <= port <= high for port in ports)
    assert len(set(ports)) == len(ports)


def test_a_free_port_is_free_for_tcp_and_udp_on_every_address() -> None:
    port = free_port()
    for kind in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
        with socket.socket(socket.AF_INET, kind) as sock:
            sock.bind(("0.0.0.0", port))


def test_a_port_held_for_udp_on_loopback_alone_is_not_handed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    held_port, next_port = free_port(), free_port()
    ports_module._handed_out.difference_update({held_port, next_port})
    # The order free_port tries ports in: the held one first.
    monkeypatch.setattr(ports_module._RANDOM, "sample", lambda *_: [held_port, next_port])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as held:
        held.bind(("127.0.0.1", held_port))
        assert free_port() == next_port
