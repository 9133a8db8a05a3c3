"""Property-based fuzzing (hypothesis) of everything a client can send: the
signaling requests, the LLM proxy's bodies, the data-channel events, and,
with keys required, forged keys and client secrets on every endpoint.

Each property runs against the real server (and, for events, a real aiortc
peer) on the test's event loop; hypothesis runs in a thread of its own and
hands each request to the loop, so one test holds a whole run: what the
process holds is counted before and after, and a real call is answered at
the end. Derandomized, with no example database: every run tries the same
2,000 cases (1,000 signaling requests, 400 proxy bodies, 200 data-channel
messages, 400 forged tokens), in 30-50 s on this 2-core machine, depending
on its other load.

Each failure it found was fixed in the code and has a regression test of its
own (test_signaling, test_llm_proxy, test_protocol, test_bad_events).

The proxy's and the tokens' properties run over the fake models (no model
decides them); the slow two keep the real ones, whose replies (real length,
real audio) the fuzzed events meet in flight.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import quote

import aiohttp
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from yarl import URL

from tests import conftest
from tests.broken_peer import ignore_max_message_size, send_as_text
from tests.conftest import ServerFactory
from tests.fuzz_inputs import (
    ACKNOWLEDGED_BY,
    PARSED_METHODS,
    Message,
    call_ids,
    content_types,
    json_depth,
    messages,
    methods,
    multipart_bodies,
    mutated_offers,
    parses_strictly,
    path_tails,
    proxy_bodies,
)
from tests.leaks import assert_nothing_left, held
from tests.logged import Logged
from tests.realtime_events import typed
from tests.test_llm_proxy import proxied
from tests.test_signaling import CALLS, real_offer
from voice_agent.client import RealtimeClient
from voice_agent.engine import Engine
from voice_agent.server.llm_proxy import CHAT_FIELDS, RESPONSES_FIELDS, TOKEN_FIELDS
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    scripted_llm_server,
    text_events,
)

# Hypothesis checks that strategies leave the global random state alone; the
# server, running on the loop meanwhile, draws from it (aioice's timer jitter).
# And aiohttp warns of each malformed Content-Disposition it is sent.
pytestmark = [
    pytest.mark.filterwarnings("ignore:Do not use the `random` module inside strategies"),
    pytest.mark.filterwarnings("ignore::aiohttp.multipart.BadContentDispositionHeader"),
]
T = TypeVar("T")
FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=list(HealthCheck),
)
CLIENT_ERROR_TYPES = {"invalid_request_error", "rate_limit_error"}


class OnLoop:
    """Runs coroutines on the test's loop from hypothesis's thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def __call__(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


async def fuzz(property_test: Callable[[], None]) -> None:
    """Run a hypothesis test in a worker thread while this loop serves."""
    await asyncio.to_thread(property_test)


def assert_json_error(status: int, headers: dict[str, str], body: bytes) -> dict[str, Any]:
    assert headers.get("Content-Type", "").startswith("application/json"), (status, body[:200])
    error = json.loads(body)["error"]
    assert error["type"] in CLIENT_ERROR_TYPES and error["code"] and error["message"], error
    return dict(error)


def assert_none_logged(errors: Logged, before: int) -> None:
    """Bad input is an answer, not an error: nothing logged at ERROR since ``before``."""
    new = [f"{r.name}: {r.getMessage()} {r.exc_info and r.exc_info[1]!r}" for r in errors.records]
    assert not new[before:], new[before:]


async def request(
    http: aiohttp.ClientSession,
    method: str,
    url: str,
    body: bytes | None = None,
    content_type: str | None = None,
) -> tuple[int, dict[str, str], bytes]:
    headers = {} if content_type is None else {"Content-Type": content_type}
    skip = () if content_type is not None else ("Content-Type",)
    async with http.request(
        method, URL(url, encoded=True), data=body, headers=headers, skip_auto_headers=skip
    ) as response:
        return response.status, dict(response.headers), await response.read()


async def answers_aloud(client: RealtimeClient) -> None:
    """A typed question gets a reply, in words and in sound."""
    done = client.wait_for_type("response.done", after=len(client.events))
    asked_at = time.monotonic()
    client.send(typed("What is the capital of France?"))
    client.send({"type": "response.create"})
    response = (await asyncio.wait_for(done, 60))["response"]
    assert response["status"] == "completed", response.get("status_details")
    assert response["output"][0]["content"][0]["transcript"].strip()
    assert client.received.first_sound_after(asked_at) is not None


async def answers_a_real_call(server_url: str, http: aiohttp.ClientSession) -> None:
    client = RealtimeClient(server_url)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    await answers_aloud(client)
    await client.hangup(http)


@pytest.mark.slow
async def test_signaling_answers_every_mutated_request_with_a_4xx_or_a_call(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(offers_per_minute=0, max_calls=50, max_offer_bytes=4096)
    pc, offer = await real_offer()
    await pc.close()
    await answers_a_real_call(server.url, http)  # warm: lazily made pools are no leak
    on_loop = OnLoop(asyncio.get_running_loop())
    outcomes: dict[int, int] = {}
    url = server.url + CALLS

    async def offered(body: bytes, content_type: str | None) -> int:
        logged = len(errors.records)
        status, headers, answer = await request(http, "POST", url, body, content_type)
        assert_none_logged(errors, logged)
        outcomes[status] = outcomes.get(status, 0) + 1
        if status == 201:  # a mutation the offer survives: a call, hung up at once
            assert headers["Content-Type"].startswith("application/sdp")
            assert answer.startswith(b"v=0")
            hung_up, _, _ = await request(http, "DELETE", server.url + headers["Location"])
            assert hung_up == 204
        else:
            assert status in (400, 413, 415), (status, answer[:300])
            assert_json_error(status, headers, answer)
        return status

    @settings(FUZZ, max_examples=250)
    @given(body=mutated_offers(offer))
    def mutated_sdp(body: bytes) -> None:
        on_loop(offered(body, "application/sdp"))

    @settings(FUZZ, max_examples=200)
    @given(form=multipart_bodies(offer))
    def broken_multipart(form: tuple[bytes, str]) -> None:
        on_loop(offered(*form))

    @settings(FUZZ, max_examples=250)
    @given(
        body=st.one_of(st.binary(max_size=600), st.just(offer.encode()), st.text().map(str.encode)),
        content_type=content_types,
    )
    def any_bytes(body: bytes, content_type: str | None) -> None:
        on_loop(offered(body, content_type))

    async def odd(method: str, path: str) -> None:
        logged = len(errors.records)
        status, headers, body = await request(http, method, server.url + path)
        if method.upper() not in PARSED_METHODS:  # not HTTP to aiohttp's parser
            assert status == 400, (method, status, body[:200])
            del errors.records[logged:]  # aiohttp logs it, on a reused connection
            return
        assert_none_logged(errors, logged)
        assert 400 <= status < 500, (method, path, status, body[:200])
        if method != "HEAD":  # no body to a HEAD
            assert_json_error(status, headers, body)

    @settings(FUZZ, max_examples=300)
    @given(method=methods, call_id=call_ids, tail=path_tails)
    def odd_methods_and_ids(method: str, call_id: str, tail: str) -> None:
        on_loop(odd(method, f"{CALLS}/{quote(call_id, safe='')}{tail}"))

    before = held()
    with Logged(level=logging.ERROR) as errors:
        for property_test in (mutated_sdp, broken_multipart, any_bytes, odd_methods_and_ids):
            await fuzz(property_test)
        held()  # collected: a task that failed unseen is logged now
    assert_none_logged(errors, 0)
    assert outcomes.get(201, 0) > 0 and outcomes.get(400, 0) > 0, outcomes  # not vacuous
    assert len(server.calls) == 0
    await assert_nothing_left(before)
    await answers_a_real_call(server.url, http)


def within_the_proxys_fields(path: str, body: dict[str, Any]) -> bool:
    """The proxy's documented fields, and token limits that are integers."""
    allowed = CHAT_FIELDS if path == "/v1/chat/completions" else RESPONSES_FIELDS
    tokens = [body.get(field) for field in TOKEN_FIELDS[path]]
    whole = all(t is None or (isinstance(t, int) and not isinstance(t, bool)) for t in tokens)
    return set(body) <= allowed and whole


async def test_the_llm_proxy_answers_every_malformed_body_with_a_4xx(
    fake_engine: Engine, http: aiohttp.ClientSession
) -> None:
    limit = 4096
    settings_ = conftest.test_settings(enable_llm_proxy=True, llm_proxy_max_body_bytes=limit)
    peer: ScriptedLlmServer
    async with (
        scripted_llm_server() as peer,
        conftest.run_server(settings_, proxied(fake_engine, peer.base_url)) as server,
    ):
        on_loop = OnLoop(asyncio.get_running_loop())
        forwarded = 0

        async def posted(path: str, body: bytes, content_type: str | None) -> None:
            nonlocal forwarded
            peer.scripts.clear()
            peer.add(Script(text_events("chat-completions", "Fine.")))
            status, headers, answer = await request(
                http, "POST", server.url + path, body, content_type
            )
            ok, value = parses_strictly(body)
            an_object = ok and isinstance(value, dict) and len(body) <= limit
            if status == 200:
                forwarded += 1
                assert an_object and within_the_proxys_fields(path, value), body[:200]
                assert b"Fine." in answer
                return
            assert status in (400, 413), (status, body[:200], answer[:300])
            assert_json_error(status, headers, answer)
            # A JSON object, within the size limit, not absurdly nested and with
            # only the fields the proxy takes, is forwarded.
            acceptable = an_object and within_the_proxys_fields(path, value)
            assert not (acceptable and json_depth(value) <= 32), body[:200]

        @settings(FUZZ, max_examples=400)
        @given(
            path=st.sampled_from(["/v1/chat/completions", "/v1/responses"]),
            body=proxy_bodies,
            content_type=st.one_of(st.just("application/json"), content_types),
        )
        def malformed_bodies(path: str, body: bytes, content_type: str | None) -> None:
            on_loop(posted(path, body, content_type))

        # Warm up the proxy's upstream pool, so it is not counted as a leak.
        await posted("/v1/chat/completions", b"{}", "application/json")
        before = held()
        forwarded = 0
        requests_before = len(peer.requests)
        await fuzz(malformed_bodies)
        # Exactly the bodies answered 200 reached the model; nothing else did.
        assert 0 < forwarded == len(peer.requests) - requests_before
        await assert_nothing_left(before)


class Pacer:
    """Spaces sends ``1 / per_second`` apart."""

    def __init__(self, per_second: float) -> None:
        self.gap_s = 1.0 / per_second
        self.next_at = 0.0

    async def wait(self) -> None:
        now = time.monotonic()
        delay = self.next_at - now
        self.next_at = max(now, self.next_at) + self.gap_s
        if delay > 0:
            await asyncio.sleep(delay)


@pytest.mark.slow
async def test_fuzzed_data_channel_events_get_error_events_and_the_call_goes_on(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory()
    await answers_a_real_call(server.url, http)  # warm: lazily made pools are no leak
    client = RealtimeClient(server.url)
    before = held()
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    ignore_max_message_size(client.pc)  # the server advertises 256 KiB
    (call,) = server.calls.calls()
    on_loop = OnLoop(asyncio.get_running_loop())
    pace = Pacer(80)  # under the server's 100 events/s: none may be dropped
    counted: dict[str, int] = {}
    sent = 0

    async def exchange(message: Message) -> list[dict[str, Any]]:
        """Send ``message``, then a marker (a real event, acknowledged with
        the session); the events in between are the message's answer."""
        nonlocal sent
        sent += 1
        marker = f"fuzz-{sent}"
        await pace.wait()
        mark = len(client.events)
        if message.kind == "text_bytes":
            assert isinstance(message.payload, bytes)
            await send_as_text(client.channel, message.payload)
        else:
            client.channel.send(message.payload)
        await pace.wait()
        acked = client.wait_for(
            lambda e: (
                (e.get("type") == "session.updated" and e["session"]["instructions"] == marker)
                or e.get("error", {}).get("event_id") == marker
            ),
            after=mark,
        )
        client.send(
            {"type": "session.update", "event_id": marker, "session": {"instructions": marker}}
        )
        try:
            ack = await asyncio.wait_for(acked, 5)
        except TimeoutError:
            raise AssertionError(
                f"no answer to {message.kind} {message.payload[:300]!r}: "
                f"{client.events[mark:][-5:]}"
            ) from None
        # The session is still whole: the marker is acknowledged, not refused.
        assert ack["type"] == "session.updated", ack
        end = client.events.index(ack, mark)
        return client.events[mark:end]

    # No shrinking: a message that broke the call fails every later one too.
    @settings(FUZZ, max_examples=200, phases=[Phase.explicit, Phase.generate])
    @given(message=messages)
    def fuzzed_events(message: Message) -> None:
        answer = on_loop(exchange(message))
        errors = [e["error"] for e in answer if e.get("type") == "error"]
        for error in errors:
            assert error["code"] != "internal_error", (message.payload[:200], error)
            counted[error["code"]] = counted.get(error["code"], 0) + 1
        expected = message.expected()
        if expected in (None, "handled"):
            assert all(e["type"] == "invalid_request_error" for e in errors), (errors, message)
            ack = ACKNOWLEDGED_BY.get(message.event_type or "")
            if expected == "handled" and ack is not None:  # acknowledged, or refused
                assert errors or any(e["type"] == ack for e in answer), message.payload[:200]
        else:
            # The one error this message deserves (replies in flight may add events).
            own = [e for e in errors if e["code"] == expected]
            assert len(own) == 1, (message.kind, message.payload[:200], errors)
            assert own[0]["type"] == "invalid_request_error"

    await fuzz(fuzzed_events)
    # Processed, not throttled: the error codes were answered, nothing was dropped.
    assert call.protocol.events_dropped == 0 and "rate_limited" not in counted
    del call  # held here, it would count as a leak
    for code in ("invalid_json", "invalid_event", "unknown_event", "event_too_large"):
        assert counted.get(code, 0) > 0, counted

    # The call is up and still answers a question aloud, with its settings put back.
    client.send(
        {
            "type": "session.update",
            "session": {
                "instructions": "Answer in one short sentence.",
                "tools": [],
                "tool_choice": "auto",
                "max_output_tokens": "inf",
                "audio": {"input": {"turn_detection": {"silence_duration_ms": 500}}},
            },
        }
    )
    mark = len(client.events)
    # A fuzzed response.create may still be speaking: stop it first.
    stopped = client.wait_for(
        lambda e: (
            e.get("type") == "response.done"
            or e.get("error", {}).get("code") == "response_cancel_not_active"
        ),
        after=mark,
    )
    client.send({"type": "response.cancel"})
    await asyncio.wait_for(stopped, 10)
    await answers_aloud(client)
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)
    await assert_nothing_left(before)


KEY = "sk-fuzz-key-0123456789"
OTHER_KEY = "sk-fuzz-other-0123456789"


def forged(secret: str, other_key_secret: str) -> st.SearchStrategy[str]:
    """Tokens made from a real client secret that must all be refused:
    every part swapped, cut, flipped or padded, and some that are not one."""
    kid, sealed, mac = secret[len("ek_") :].split(".")
    other_kid = other_key_secret[len("ek_") :].split(".")[0]

    def flipped(text: str, at: int) -> str:
        at %= len(text)
        swap = "A" if text[at] != "A" else "B"
        return text[:at] + swap + text[at + 1 :]

    return st.one_of(
        st.integers(0, 10_000).map(lambda i: f"ek_{kid}.{flipped(sealed, i)}.{mac}"),
        st.integers(0, 10_000).map(lambda i: f"ek_{kid}.{sealed}.{flipped(mac, i)}"),
        st.integers(1, len(secret) - 1).map(lambda i: secret[:i]),
        st.just(f"ek_{other_kid}.{sealed}.{mac}"),
        st.just(f"ek_{kid}.{sealed}.{mac}="),
        st.just(f"ek_{kid}.{sealed}.{mac}.{mac}"),
        st.text(min_size=1, max_size=200).map(lambda t: "ek_" + t),
        st.text(min_size=1, max_size=200),
        st.sampled_from([KEY[:-1], KEY + "x", KEY.upper(), f"ek_{KEY}", "ék_" + secret[3:]]),
    )


async def test_forged_keys_and_secrets_get_a_401_on_every_endpoint(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory(
        auth="required",
        api_keys=[KEY, OTHER_KEY],
        offers_per_minute=0,
        requests_per_minute_per_key=0,
        max_calls=50,
    )
    pc, offer = await real_offer()
    await pc.close()
    as_key = {"Authorization": f"Bearer {KEY}"}
    async with http.post(server.url + "/v1/realtime/client_secrets", json={}, headers=as_key) as r:
        secret = (await r.json())["value"]
    other = {"Authorization": f"Bearer {OTHER_KEY}"}
    async with http.post(server.url + "/v1/realtime/client_secrets", json={}, headers=other) as r:
        other_secret = (await r.json())["value"]
    warm = RealtimeClient(server.url, token=KEY)  # lazily made pools are no leak
    await warm.connect(http)
    await warm.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)
    before = held()
    # A live call of the key's, for the endpoints that manage one.
    owned = RealtimeClient(server.url, token=KEY)
    await owned.connect(http)
    call_path = owned.location
    assert call_path is not None
    on_loop = OnLoop(asyncio.get_running_loop())
    endpoints = [
        ("POST", CALLS, offer.encode(), "application/sdp"),
        ("POST", "/v1/realtime/client_secrets", b"{}", "application/json"),
        ("GET", "/v1/ice-servers", None, None),
        ("GET", "/v1/stats", None, None),
        ("GET", call_path, None, None),
        ("DELETE", call_path, None, None),
    ]
    statuses: dict[int, int] = {}

    async def refused(token: str, endpoint: int) -> None:
        method, path, body, content_type = endpoints[endpoint]
        logged = len(errors.records)
        headers = {"Authorization": f"Bearer {token}"}
        if content_type is not None:
            headers["Content-Type"] = content_type
        try:
            async with http.request(
                method, server.url + path, data=body, headers=headers
            ) as response:
                status, answer = response.status, await response.read()
        except ValueError:
            return  # a header aiohttp itself will not send (a line break, say)
        assert_none_logged(errors, logged)
        statuses[status] = statuses.get(status, 0) + 1
        assert status == 401, (method, path, token[:80], status, answer[:200])
        assert_json_error(status, dict(response.headers), answer)

    @settings(FUZZ, max_examples=400)
    @given(token=forged(secret, other_secret), endpoint=st.integers(0, len(endpoints) - 1))
    def forged_tokens(token: str, endpoint: int) -> None:
        on_loop(refused(token, endpoint))

    with Logged(level=logging.ERROR) as errors:
        await fuzz(forged_tokens)
        held()
    assert_none_logged(errors, 0)
    assert statuses == {401: sum(statuses.values())} and statuses[401] > 300, statuses
    assert len(server.calls) == 1  # the owned call, untouched
    # The real secret and key still work after all that.
    client = RealtimeClient(server.url, token=secret)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    await client.hangup(http)
    await owned.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)
    del owned, client  # closed; held here, they would count as leaks
    await assert_nothing_left(before)
