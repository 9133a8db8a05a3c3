"""Two replicas behind a balancer that shares nothing between them (round
robin, no stickiness), as the Kubernetes manifests run them: a client
secret minted through one replica opens a call on the other, and is spent
there. Real server processes, a real HTTP proxy, a real aiortc caller."""

from __future__ import annotations

import asyncio
import itertools
import signal
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from voice_agent.client import RealtimeClient
from voice_agent.testing.local_http import serve_on_loopback
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    chat_text,
    scripted_llm_server,
)
from voice_agent.testing.serving import start_server, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

KEY = "sk-replica-key-0123456"
SECRETS = "/v1/realtime/client_secrets"
FORWARDED = ("Content-Type", "Location")


def round_robin(
    upstreams: list[str], http: aiohttp.ClientSession
) -> tuple[web.Application, list[str]]:
    """A balancer: each request to the next replica in turn, as is; and the
    replicas it sent them to, in order."""
    turns = itertools.cycle(upstreams)
    served: list[str] = []

    async def forward(request: web.Request) -> web.StreamResponse:
        upstream = next(turns)
        served.append(upstream)
        headers = {
            k: v for k, v in request.headers.items() if k in ("Authorization", "Content-Type")
        }
        async with http.request(
            request.method, upstream + request.path_qs, data=await request.read(), headers=headers
        ) as answer:
            kept = {k: answer.headers[k] for k in FORWARDED if k in answer.headers}
            return web.Response(status=answer.status, body=await answer.read(), headers=kept)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", forward)
    return app, served


@pytest.fixture
async def llm() -> AsyncIterator[ScriptedLlmServer]:
    async with scripted_llm_server() as server:
        server.script_for = lambda body: Script(chat_text("Hello there."))
        yield server


async def test_a_secret_minted_on_one_replica_opens_a_call_on_the_other(
    llm: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    flags = ("--auth", "required", "--api-keys", KEY, "--llm-base-url", llm.base_url)
    replicas = [await start_server(*flags), await start_server(*flags)]
    try:
        for _, url in replicas:
            await wait_ready(http, url, timeout_s=240)
        balancer, served = round_robin([url for _, url in replicas], http)
        async with serve_on_loopback(balancer) as front:
            body = {"session": {"instructions": "Say banana."}}
            headers = {"Authorization": f"Bearer {KEY}"}
            async with http.post(front + SECRETS, json=body, headers=headers) as minted:
                assert minted.status == 200, await minted.text()
                secret = (await minted.json())["value"]
            client = RealtimeClient(front, token=secret)  # this offer goes to the other
            try:
                await client.connect(http)
                created = await asyncio.wait_for(client.wait_for_type("session.created"), 10)
                assert created["session"]["instructions"] == "Say banana."
            finally:
                await client.pc.close()
            assert served == [replicas[0][1], replicas[1][1]]
            # Spent where it was used: a second call with it is refused there.
            again = RealtimeClient(replicas[1][1], token=secret)
            with pytest.raises(RuntimeError, match="invalid_client_secret"):
                await again.connect(http)
            await again.pc.close()
    finally:
        for process, _ in replicas:
            process.send_signal(signal.SIGTERM)
        for process, _ in replicas:
            async with asyncio.timeout(30):
                await process.wait()
