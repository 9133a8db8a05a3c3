"""Per-address limits behind a reverse proxy: X-Forwarded-For names the
client only when the peer sending it is a listed proxy. Real server, fake
models."""

from __future__ import annotations

import ipaddress

import aiohttp
import pytest
from multidict import CIMultiDict

from tests.conftest import RunningServer, ServerFactory
from voice_agent.server.forwarded import forwarded_client

PROXIES = [ipaddress.ip_network("127.0.0.1/32"), ipaddress.ip_network("10.0.0.0/8")]


@pytest.mark.parametrize(
    ("remote", "header", "client"),
    [
        ("127.0.0.1", "203.0.113.5", "203.0.113.5"),
        # What the client claimed (left) is skipped for what the proxies saw.
        ("127.0.0.1", "1.2.3.4, 203.0.113.5", "203.0.113.5"),
        ("127.0.0.1", "203.0.113.5, 10.1.2.3", "203.0.113.5"),  # through two proxies
        ("127.0.0.1", "10.1.2.3", "10.1.2.3"),  # only proxies: the leftmost
        ("127.0.0.1", "junk, 203.0.113.5", "203.0.113.5"),
        ("127.0.0.1", "203.0.113.5, junk", None),  # the proxy's own entry is not an address
        ("198.51.100.7", "203.0.113.5", None),  # not a listed proxy: ignored
    ],
)
def test_the_client_is_the_rightmost_address_that_is_not_a_listed_proxy(
    remote: str, header: str, client: str | None
) -> None:
    assert forwarded_client(remote, header, PROXIES) == client


async def offer_status(http: aiohttp.ClientSession, server: RunningServer, client: str) -> int:
    """A (bad) offer said to come from ``client``: its status."""
    headers = {"Content-Type": "application/sdp", "X-Forwarded-For": client}
    async with http.post(server.url + "/v1/realtime/calls", data="v=0", headers=headers) as r:
        return r.status


async def test_offers_are_counted_per_forwarded_client_only_behind_a_listed_proxy(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    behind = await fake_server_factory(offers_per_minute=1, trusted_proxies=["127.0.0.1"])
    assert await offer_status(http, behind, "203.0.113.5") == 400
    assert await offer_status(http, behind, "203.0.113.5") == 429
    assert await offer_status(http, behind, "203.0.113.6") == 400  # another client
    # Without the setting, the header is anyone's claim: every offer is the peer's.
    direct = await fake_server_factory(offers_per_minute=1)
    assert await offer_status(http, direct, "203.0.113.5") == 400
    assert await offer_status(http, direct, "203.0.113.6") == 429


async def test_a_forwarded_for_line_the_proxy_added_is_read_after_the_clients_own(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    # A proxy that adds its own header line (HAProxy's option forwardfor)
    # leaves the client's claim first: the client is still the last one.
    behind = await fake_server_factory(offers_per_minute=1, trusted_proxies=["127.0.0.1"])
    statuses = []
    for claimed in ("1.1.1.1", "2.2.2.2", "3.3.3.3"):
        headers = [
            ("Content-Type", "application/sdp"),
            ("X-Forwarded-For", claimed),
            ("X-Forwarded-For", "203.0.113.5"),
        ]
        async with http.post(
            behind.url + "/v1/realtime/calls", data="v=0", headers=CIMultiDict(headers)
        ) as response:
            statuses.append(response.status)
    assert statuses == [400, 429, 429]
