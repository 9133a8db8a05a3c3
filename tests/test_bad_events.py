"""What a broken peer sends on the data channel that aiortc cannot take by
itself is answered (or dropped), and the call goes on: each of these used to
end the call's DTLS transport (its audio too) or leave the client waiting.
Real peers, fake models."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.broken_peer import ignore_max_message_size, send_as_text, send_channel_open
from tests.conftest import ServerFactory
from voice_agent.client import RealtimeClient
from voice_agent.realtime.protocol import MAX_CLIENT_EVENT_BYTES
from voice_agent.rtc.call import Call


async def still_answers(client: RealtimeClient) -> None:
    """The data channel still carries events both ways."""
    updated = client.wait_for(
        lambda e: e.get("type") == "session.updated" and e["session"]["instructions"] == "Hi.",
        after=len(client.events),
    )
    client.send({"type": "session.update", "session": {"instructions": "Hi."}})
    await asyncio.wait_for(updated, 5)


async def test_text_that_is_not_utf8_gets_invalid_json_and_bad_channel_opens_are_dropped(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    client = RealtimeClient(server.url)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)

    refused = client.wait_for(
        lambda e: e.get("error", {}).get("code") == "invalid_json", after=len(client.events)
    )
    await send_as_text(client.channel, b'{"type": "session.update", "x": "\xff\xfe"}')
    assert "not valid JSON" in (await asyncio.wait_for(refused, 5))["error"]["message"]
    await still_answers(client)

    # A label that is not UTF-8, and a second open of the events channel's stream.
    await send_channel_open(client.channel, 20, b"\xffbad")
    assert client.channel.id is not None
    await send_channel_open(client.channel, client.channel.id, b"oai-events")
    await still_answers(client)
    (call,) = server.calls.calls()
    assert isinstance(call, Call) and call.pc.connectionState == "connected"
    await client.hangup(http)


async def test_an_answer_too_large_for_the_peer_is_replaced_by_an_error(
    fake_server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await fake_server_factory()
    client = RealtimeClient(server.url)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    ignore_max_message_size(client.pc)
    # Instructions that fit in the event but not in its echo, session.updated.
    instructions = "x" * (MAX_CLIENT_EVENT_BYTES - 100)
    mark = len(client.events)
    answered = client.wait_for(lambda e: e.get("type") in ("error", "session.updated"), mark)
    client.send({"type": "session.update", "session": {"instructions": instructions}})
    error = (await asyncio.wait_for(answered, 5))["error"]
    assert error["code"] == "event_too_large" and "session.updated" in error["message"]
    await still_answers(client)
    await client.hangup(http)
    assert len(server.calls) == 0
