"""--public-url: a call's Location names the replica that owns it, and the
call's DELETE is served under that URL's path (what an ingress routing
/pod/NAME/ to one replica forwards, unrewritten)."""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import aiohttp
import pytest
from pydantic import ValidationError

from tests.conftest import ServerFactory
from tests.conftest import test_settings as settings_with
from voice_agent.client import RealtimeClient

PUBLIC = "https://voice.example.test/pod/voice-agent-1"


async def test_the_location_is_pod_addressed_and_its_path_hangs_up(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(public_url=PUBLIC + "/")
    client = RealtimeClient(server.url)
    try:
        await client.connect(http)
        assert client.location is not None
        call_id = client.location.rsplit("/", 1)[-1]
        assert client.location == f"{PUBLIC}/v1/realtime/calls/{call_id}"
        assert client.call_url == client.location
        # What the ingress forwards to this replica: the Location's own path.
        path = urlsplit(client.location).path
        async with http.delete(server.url + path) as hung_up:
            assert hung_up.status == 204
        await asyncio.wait_for(server.calls.wait_for_count(0), 5)
        async with http.delete(server.url + path) as again:
            assert again.status == 404
    finally:
        await client.pc.close()


async def test_without_a_public_url_the_location_is_a_path(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    client = RealtimeClient(server.url)
    await client.connect(http)
    assert client.location is not None and client.location.startswith("/v1/realtime/calls/")
    assert client.call_url == server.url + client.location
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


@pytest.mark.parametrize("url", ["voice.example.test", "ftp://h/x", "https://h/x?a=1"])
def test_a_public_url_that_is_not_an_absolute_http_url_is_refused(url: str) -> None:
    with pytest.raises(ValidationError, match="absolute http"):
        settings_with(public_url=url)
