"""The client's address behind a reverse proxy.

Behind a proxy every request comes from the proxy's address, so the
per-address limits would count all clients as one. ``X-Forwarded-For``
names the client, but anyone can send that header: it is read only from
the proxies the operator lists (``--trusted-proxies``), and from the
right, skipping listed proxies, so the first address that is not one of
them is the client (entries left of it are whatever the client claimed).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable

from aiohttp import web

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _address(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def forwarded_client(remote: str | None, header: str, trusted: list[Network]) -> str | None:
    """The client's address, or None when ``remote`` is not a trusted
    proxy or the header names no client."""
    peer = _address(remote or "")
    if peer is None or not any(peer in network for network in trusted):
        return None
    client: str | None = None
    for entry in reversed(header.split(",")):
        address = _address(entry)
        if address is None:
            break  # not an address: nothing left of it can be trusted
        client = str(address)
        if not any(address in network for network in trusted):
            break
    return client


def trusted_proxies_middleware(proxies: list[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    trusted = [ipaddress.ip_network(p, strict=False) for p in proxies]

    @web.middleware
    async def from_forwarded_for(request: web.Request, handler: Handler) -> web.StreamResponse:
        # Every line of it, in order: a proxy may add its own line after the
        # one the client sent (RFC 9110 5.3: the same as one joined by commas).
        header = ",".join(request.headers.getall("X-Forwarded-For", ()))
        if trusted and header:
            client = forwarded_client(request.remote, header, trusted)
            if client is not None:
                request = request.clone(remote=client)
        return await handler(request)

    return from_forwarded_for
