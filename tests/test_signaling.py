"""Every way signaling can go wrong gets a clear answer and leaves nothing
behind. Real server and peers over the fake models (no model decides any of it)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiortc import RTCPeerConnection

from tests import conftest
from tests.conftest import ServerFactory
from tests.leaks import assert_nothing_left, held
from voice_agent.client import RealtimeClient
from voice_agent.engine import Engine
from voice_agent.testing.scripted_llm import (
    close_quietly,
    engine_with_llm,
    make_llm,
    scripted_llm_server,
)

CALLS = "/v1/realtime/calls"


async def real_offer() -> tuple[RTCPeerConnection, str]:
    pc = RTCPeerConnection()
    pc.addTransceiver("audio", direction="sendrecv")
    pc.createDataChannel("oai-events")
    await pc.setLocalDescription(await pc.createOffer())
    return pc, pc.localDescription.sdp


VIDEO_ONLY_SDP = (
    "v=0\r\no=- 1 1 IN IP4 127.0.0.1\r\ns=-\r\nt=0 0\r\n"
    "m=video 9 UDP/TLS/RTP/SAVPF 96\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:96 VP8/90000\r\n"
)
BROKEN_AUDIO_SDP = "v=0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\nthis is not sdp\r\n"


async def post(
    http: aiohttp.ClientSession, url: str, body: bytes | str, content_type: str = "application/sdp"
) -> tuple[int, dict[str, str], str]:
    async with http.post(url + CALLS, data=body, headers={"Content-Type": content_type}) as r:
        return r.status, dict(r.headers), await r.text()


async def test_wrong_content_type_is_415(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    status, headers, body = await post(http, server.url, "v=0", "application/json")
    assert status == 415
    assert "application/sdp" in body and headers["Content-Type"].startswith("application/json")


async def test_oversized_body_is_413(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(max_offer_bytes=4096)
    status, _, body = await post(http, server.url, "v=0\r\n" + "a=x\r\n" * 2000)
    assert status == 413 and "body_too_large" in body

    async def chunks() -> AsyncIterator[
        bytes
    ]:  # no Content-Length: the limit is enforced while reading
        for _ in range(10):
            yield b"a=padding-padding-padding-padding-padding\r\n" * 20

    async with http.post(
        server.url + CALLS, data=chunks(), headers={"Content-Type": "application/sdp"}
    ) as response:
        assert response.status == 413


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"hello", "invalid_sdp"),
        (b"\xff\xfe\x00garbage", "invalid_sdp"),
        (VIDEO_ONLY_SDP.encode(), "no_audio"),
        (BROKEN_AUDIO_SDP.encode(), "invalid_sdp"),
    ],
)
async def test_bad_offers_are_400_with_a_json_error(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession, body: bytes, code: str
) -> None:
    server = await fake_server_factory()
    status, headers, text = await post(http, server.url, body)
    assert status == 400, text
    assert headers["Content-Type"].startswith("application/json")
    assert f'"code": "{code}"' in text
    assert len(server.calls) == 0


async def test_server_full_is_503_with_retry_after(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(max_calls=1)
    client = RealtimeClient(server.url)
    await client.connect(http)
    calls_before = len(server.calls)
    pc, offer = await real_offer()
    status, headers, body = await post(http, server.url, offer)
    await pc.close()
    assert status == 503 and headers["Retry-After"].isdigit() and "server_full" in body
    assert len(server.calls) == calls_before == 1
    async with http.get(server.url + "/readyz") as ready:
        assert ready.status == 503 and (await ready.json())["status"] == "full"
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_hangup_with_delete(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    client = RealtimeClient(server.url)
    await client.connect(http)
    assert client.location is not None and client.location.startswith(CALLS + "/rtc_")
    async with http.delete(server.url + client.location) as response:
        assert response.status == 204
    assert len(server.calls) == 0
    async with http.delete(server.url + client.location) as response:
        assert response.status == 404
    await client.hangup()


async def test_unknown_call_is_404(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    async with http.delete(server.url + CALLS + "/rtc_nope") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "call_not_found"


async def test_a_body_nested_past_the_parsers_depth_is_a_bad_request(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    # Python's own parser fails on it with a RecursionError, not a ValueError.
    server = await fake_server_factory()
    client = RealtimeClient(server.url)
    await client.connect(http)
    assert client.location is not None
    for action in ("hold", "dtmf"):
        async with http.post(
            server.url + client.location + "/" + action,
            data="[" * 50_000,
            headers={"Content-Type": "application/json"},
        ) as response:
            assert response.status == 400, (action, await response.text())
    assert len(server.calls) == 1  # the call goes on
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_an_offer_that_never_connects_costs_the_llm_nothing(
    fake_engine: Engine, http: aiohttp.ClientSession
) -> None:
    """The LLM prefill starts once the caller is connected: a burst of offers
    hung up at once left the model busy with prompts for calls long gone
    (found as a slow real call after the fuzzer's 200 short-lived calls)."""
    async with scripted_llm_server() as peer:
        llm = make_llm("chat-completions", peer.base_url)
        prefilled = engine_with_llm(fake_engine, llm, llm_prefill=True)
        settings = conftest.test_settings(connect_timeout_s=1.0)
        async with conftest.run_server(settings, prefilled) as server:
            pc, offer = await real_offer()
            status, _, _ = await post(http, server.url, offer)
            assert status == 201
            await pc.close()  # never applies the answer: never connects
            await asyncio.wait_for(server.calls.wait_for_count(0), 5)
            assert peer.requests == []
            client = RealtimeClient(server.url)
            await client.connect(http)
            await asyncio.wait_for(peer.arrived.wait(), 5)  # the caller's prefill
            assert len(peer.requests) == 1
            await client.hangup(http)
        await close_quietly(llm)


async def test_a_peer_that_disappears_is_released(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(disconnect_grace_s=0.5)
    client = RealtimeClient(server.url)
    await client.connect(http)
    assert len(server.calls) == 1
    await client.pc.close()  # no DELETE: the peer just goes away
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)


async def test_calls_end_at_the_maximum_duration(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(max_call_duration_s=1.5)
    client = RealtimeClient(server.url)
    await client.connect(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 6)
    await client.hangup()


async def test_cors_preflight_and_exposed_location(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(cors_origins=["https://app.example"])
    headers = {
        "Origin": "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    async with http.options(server.url + CALLS, headers=headers) as response:
        assert response.status == 204
        assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"
        allowed = response.headers["Access-Control-Allow-Headers"].lower()
        assert "authorization" in allowed and "content-type" in allowed
    async with http.options(
        server.url + CALLS, headers={**headers, "Origin": "https://evil.example"}
    ) as response:
        assert response.status == 403
        assert "Access-Control-Allow-Origin" not in response.headers
    status, _, _ = await post(http, server.url, b"nope")
    assert status == 400  # errors carry CORS headers too, so browsers can read them
    async with http.post(
        server.url + CALLS,
        data=b"x",
        headers={"Content-Type": "application/sdp", "Origin": "https://app.example"},
    ) as response:
        assert response.headers["Access-Control-Expose-Headers"] == "Location, Retry-After"


@pytest.mark.parametrize(
    "asked",
    [
        # OpenAI's agents SDK (in a browser), its Python/Node SDKs, and the beta header.
        "authorization,content-type,x-openai-agents-sdk",
        "authorization, openai-beta, x-stainless-arch, x-stainless-lang, x-stainless-os, "
        "x-stainless-package-version, x-stainless-retry-count, x-stainless-runtime, "
        "x-stainless-runtime-version, x-stainless-timeout",
    ],
)
async def test_cors_preflight_allows_the_headers_an_allowed_origin_asks_for(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession, asked: str
) -> None:
    server = await fake_server_factory(cors_origins=["https://app.example"])
    preflight = {
        "Origin": "https://app.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": asked,
    }
    async with http.options(server.url + CALLS, headers=preflight) as response:
        assert response.status == 204
        assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"
        allowed = {h.strip() for h in response.headers["Access-Control-Allow-Headers"].split(",")}
        assert allowed == {h.strip() for h in asked.split(",")}
        # Caches must not hand this answer to another origin or header list.
        vary = {v.strip() for v in response.headers["Vary"].split(",")}
        assert vary == {"Origin", "Access-Control-Request-Headers"}
    # Another origin asking the same is still refused, with no CORS headers.
    async with http.options(
        server.url + CALLS, headers={**preflight, "Origin": "https://evil.example"}
    ) as response:
        assert response.status == 403
        assert "Access-Control-Allow-Headers" not in response.headers
    # The call itself, with those headers sent, is answered with CORS headers.
    sent = {h.strip(): "1" for h in asked.split(",") if h.strip() != "content-type"}
    async with http.post(
        server.url + CALLS,
        data=b"x",
        headers={**sent, "Content-Type": "application/sdp", "Origin": "https://app.example"},
    ) as response:
        assert response.status == 400
        assert response.headers["Access-Control-Allow-Origin"] == "https://app.example"


async def test_cors_preflight_with_any_origin_varies_on_the_asked_headers(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(cors_origins=["*"])
    preflight = {
        "Origin": "https://anywhere.example",
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "x-openai-agents-sdk",
    }
    async with http.options(server.url + CALLS, headers=preflight) as response:
        assert response.status == 204
        assert response.headers["Access-Control-Allow-Origin"] == "*"
        assert response.headers["Access-Control-Allow-Headers"] == "x-openai-agents-sdk"
        assert response.headers["Vary"] == "Access-Control-Request-Headers"
    # A header list that is no list of header names is not echoed.
    bad = {**preflight, "Access-Control-Request-Headers": "x-a; evil=1"}
    async with http.options(server.url + CALLS, headers=bad) as response:
        assert response.status == 204
        assert response.headers["Access-Control-Allow-Headers"] == "Authorization, Content-Type"


async def test_health_and_readiness(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    async with http.get(server.url + "/healthz") as response:
        assert response.status == 200
    async with http.get(server.url + "/readyz") as response:
        assert response.status == 200 and (await response.json())["ready"] is True


async def test_fifty_bad_requests_leave_nothing_behind(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(max_offer_bytes=4096)
    bodies: list[tuple[bytes, str]] = [
        (b"nonsense", "application/sdp"),
        (VIDEO_ONLY_SDP.encode(), "application/sdp"),
        (BROKEN_AUDIO_SDP.encode(), "application/sdp"),
        (b"v=0", "text/plain"),
        (b"v=0\r\n" + b"a=x\r\n" * 2000, "application/sdp"),
    ]
    # Warm up once so lazily created pools don't count as leaks.
    await post(http, server.url, b"nonsense")
    before = held()
    for i in range(50):
        body, content_type = bodies[i % len(bodies)]
        status, _, _ = await post(http, server.url, body, content_type)
        assert status in (400, 413, 415)
    await asyncio.sleep(0.1)
    assert len(server.calls) == 0
    await assert_nothing_left(before)


async def test_a_malformed_offer_never_reaches_a_peer_connection(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    gc.collect()
    pcs_before = sum(isinstance(o, RTCPeerConnection) for o in gc.get_objects())
    created: list[object] = []
    original = RTCPeerConnection.__init__

    def spy(self: RTCPeerConnection, *args: Any, **kwargs: Any) -> None:
        created.append(self)
        original(self, *args, **kwargs)

    RTCPeerConnection.__init__ = spy  # type: ignore[method-assign]
    try:
        status, _, _ = await post(http, server.url, BROKEN_AUDIO_SDP.encode())
    finally:
        RTCPeerConnection.__init__ = original  # type: ignore[method-assign]
    assert status == 400
    assert created == []
    assert sum(isinstance(o, RTCPeerConnection) for o in gc.get_objects()) == pcs_before


def mutate(sdp: str, prefix: str, replacement: str) -> str:
    """The offer with its first line starting with ``prefix`` replaced."""
    lines = sdp.split("\r\n")
    index = next(i for i, line in enumerate(lines) if line.startswith(prefix))
    lines[index] = replacement
    return "\r\n".join(lines)


@pytest.mark.parametrize(
    ("prefix", "replacement", "says"),
    [
        # Each of these tripped an ``assert`` in aiortc's parser (a 500, and
        # no check at all under ``python -O``).
        ("a=candidate:", "a=candidate:1 1 udp 2130706431", "malformed ICE candidate"),
        ("a=candidate:", "a=candidate:1 1 udp x 10.0.0.1 9 typ host", "malformed ICE candidate"),
        ("m=audio", "m=audio 9 UDP/TLS/RTP/SAVPF 300", "invalid RTP payload type"),
        ("m=audio", "m=audio nine UDP/TLS/RTP/SAVPF 111", "malformed media line"),
        ("c=", "c=IN IP4", "malformed connection line"),
        # Found by tests/test_fuzz.py: each was a 500 (AttributeError in
        # aiortc answering, or closing, a connection without a transport).
        ("a=mid:0", "a=mid:9", "BUNDLE names '0'"),
        ("a=sendrecv", "a=mid:1", "a second media id"),
        ("m=audio", "m=text 9 UDP/TLS/RTP/SAVPF 111", "BUNDLE names '0'"),
        ("a=rtcp:", "a=rtcp", "could not be parsed"),
    ],
)
async def test_offers_with_a_malformed_line_are_400_naming_it(
    fake_server_factory: ServerFactory,
    http: aiohttp.ClientSession,
    prefix: str,
    replacement: str,
    says: str,
) -> None:
    server = await fake_server_factory()
    pc, sdp = await real_offer()
    await pc.close()
    if prefix == "a=candidate:" and prefix not in sdp:  # no candidates gathered: add one
        sdp = sdp.replace("a=mid:0\r\n", "a=mid:0\r\na=candidate:x\r\n", 1)
    status, _, text = await post(http, server.url, mutate(sdp, prefix, replacement))
    assert status == 400, text
    assert '"code": "invalid_sdp"' in text and says in text
    assert len(server.calls) == 0


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data", b"--x\r\nContent-Disposition: form-data; name=sdp\r\n\r\nv=0"),
        ("multipart/form-data; boundary=x", b"--x\r\nbroken header line\r\n\r\nv=0\r\n--x--"),
        ("multipart/form-data; boundary=x", b"--x\r\nContent-Disposition: form-data; name=sdp"),
    ],
    ids=["no-boundary", "broken-part-header", "cut-short"],
)
async def test_broken_multipart_bodies_are_400(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession, content_type: str, body: bytes
) -> None:
    server = await fake_server_factory()
    status, _, text = await post(http, server.url, body, content_type)
    assert status == 400, text
    assert '"code": "invalid_' in text
    assert len(server.calls) == 0


async def test_a_client_over_its_offer_rate_gets_429_and_others_do_not(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(offers_per_minute=3)
    for _ in range(3):  # bad offers count too: a flood is a flood
        status, _, _ = await post(http, server.url, b"nonsense")
        assert status == 400
    status, headers, text = await post(http, server.url, b"nonsense")
    assert status == 429, text
    assert '"code": "rate_limited"' in text and int(headers["Retry-After"]) >= 1
    # Another client address (the loopback range is all this machine's) still calls.
    other = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
    async with aiohttp.ClientSession(connector=other) as elsewhere:
        status, _, _ = await post(elsewhere, server.url, b"nonsense")
    assert status == 400
    async with http.get(server.url + "/v1/stats") as response:
        assert (await response.json())["refused_rate_limited"] == 1
    assert len(server.calls) == 0


async def test_no_such_route_or_method_gets_the_json_error_shape(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    async with http.get(server.url + CALLS) as response:
        assert response.status == 405 and "POST" in response.headers["Allow"]
        error = (await response.json())["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "method_not_allowed"
    assert "GET /v1/realtime/calls" in error["message"]
    async with http.post(server.url + CALLS + "/rtc_x/y", data=b"") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "not_found"
