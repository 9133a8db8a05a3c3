"""Telephone-gateway media: G.711 both ways, ice-lite offers, RFC 4733 DTMF.

A real aiortc client offers what a SIP gateway offers (only PCMU or PCMA,
telephone-event, optionally ``a=ice-lite``) to the real server and models.
"""

from __future__ import annotations

import asyncio

import aiohttp
import numpy as np
import pytest

from tests.conftest import ServerFactory
from voice_agent.client import RealtimeClient
from voice_agent.rtc.dtmf import KeyPresses
from voice_agent.testing.audio_data import librivox, reference, silence, word_error_rate

pytestmark = pytest.mark.e2e


def audio_codecs(sdp: str) -> list[str]:
    """The rtpmap names of the audio section, in the SDP's order."""
    section = sdp.split("m=audio", 1)[1].split("\r\nm=", 1)[0]
    return [line.split(" ", 1)[1] for line in section.split("\r\n") if line.startswith("a=rtpmap:")]


@pytest.mark.parametrize(("codec", "ice_lite"), [("audio/PCMU", False), ("audio/PCMA", True)])
@pytest.mark.slow
async def test_a_g711_caller_is_heard_and_answered_in_g711(
    server_factory: ServerFactory, http: aiohttp.ClientSession, codec: str, ice_lite: bool
) -> None:
    server = await server_factory()
    client = RealtimeClient(server.url, codec=codec, ice_lite=ice_lite)
    await client.connect(http)
    # The answer sends audio in the offered codec, at 8 kHz; no Opus anywhere.
    answer = client.pc.remoteDescription.sdp
    name = codec.split("/")[1]
    assert audio_codecs(answer) == [f"{name}/8000", "telephone-event/8000"]
    assert "a=end-of-candidates" in answer  # non-trickle: every candidate is in it
    (call,) = server.calls.calls()
    assert call.codec == codec  # type: ignore[attr-defined]

    done = client.wait_for_type("response.done")
    sent = await client.mic.play(np.concatenate((librivox("0930"), silence(0.3))), 16000)
    response = (await asyncio.wait_for(done, 30))["response"]
    (heard,) = client.of_type("conversation.item.input_audio_transcription.completed")
    # Narrowband costs some accuracy, not the meaning.
    assert word_error_rate(reference("0930"), heard["transcript"]) <= 0.25
    assert response["status"] == "completed"
    first_sound = client.received.first_sound_after(sent)
    assert first_sound is not None, "no audible reply came back"
    assert client.received.peak_between(first_sound, first_sound + 1.0) > 2000
    # The reply really arrived as 8 kHz G.711 (160 samples per 20 ms frame).
    assert {len(chunk) for chunk in client.received.chunks} == {160}

    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_a_browser_offer_with_g711_too_keeps_opus(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory()
    client = RealtimeClient(server.url)  # Opus first, then G.722, PCMU, PCMA
    await client.connect(http)
    assert audio_codecs(client.pc.remoteDescription.sdp)[0] == "opus/48000/2"
    (call,) = server.calls.calls()
    assert call.codec == "audio/opus"  # type: ignore[attr-defined]
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


async def test_key_presses_arrive_as_dtmf_events_and_a_hangup_digit_ends_the_call(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory(dtmf_hangup_digits="0")
    client = RealtimeClient(server.url, codec="audio/PCMU")
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 5)
    for digit in "12#":
        await client.send_dtmf(digit)
    await asyncio.wait_for(
        client.wait_for(lambda e: e.get("event") == "#"),
        5,
    )
    digits = client.of_type("input_audio_buffer.dtmf_event_received")
    # Each press once, although each was six packets.
    assert [d["event"] for d in digits] == ["1", "2", "#"]
    assert all(isinstance(d["received_at"], int) for d in digits)
    assert len(server.calls) == 1
    # How a gateway learns the call still lives (and later, that it does not).
    async with http.get(f"{server.url}{client.location}") as live:
        assert live.status == 200
        assert (await live.json())["status"] == "active"

    await client.send_dtmf("0")
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    assert server.calls.ended.get("dtmf_hangup") == 1
    async with http.get(f"{server.url}{client.location}") as gone:
        assert gone.status == 404
    await client.hangup()


async def test_an_offer_with_no_audio_codec_but_telephone_event_is_refused(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server = await server_factory()
    client = RealtimeClient(server.url, codec="audio/PCMU")
    client.codec = "audio/telephone-event"  # offer nothing else
    with pytest.raises(RuntimeError, match=r"400.*no audio codec in common"):
        await client.connect(http)
    await client.hangup()
    assert len(server.calls) == 0


async def test_key_presses_from_a_gateways_sip_info_are_heard_once_each(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    """A SIP gateway posts the keys a phone sent as SIP INFO; a phone that
    sends a press both ways (INFO and RFC 4733) is heard once per press."""
    server = await server_factory()
    client = RealtimeClient(server.url, codec="audio/PCMU")
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 5)
    dtmf_url = f"{server.url}{client.location}/dtmf"

    async with http.post(dtmf_url, json={"digits": "12"}) as answer:
        assert answer.status == 200, await answer.text()
        assert await answer.json() == {"digits": "12"}
    # The same key pressed twice, each press sent both ways.
    for _ in range(2):
        await client.send_dtmf("5")
        await asyncio.wait_for(client.wait_for(lambda e: e.get("event") == "5"), 5)
        async with http.post(dtmf_url, json={"digits": "5"}) as answer:
            assert await answer.json() == {"digits": ""}  # the audio's report came first
    async with http.post(dtmf_url, json={"digits": "#"}) as answer:
        assert await answer.json() == {"digits": "#"}
    await asyncio.wait_for(client.wait_for(lambda e: e.get("event") == "#"), 5)
    digits = client.of_type("input_audio_buffer.dtmf_event_received")
    assert [d["event"] for d in digits] == ["1", "2", "5", "5", "#"]

    for body in ({"digits": ""}, {"digits": "12x"}, {"digits": 5}, ["1"], {"digits": "1" * 33}):
        async with http.post(dtmf_url, json=body) as refused:
            assert refused.status == 400
            assert (await refused.json())["error"]["code"] == "invalid_digits"
    async with http.post(dtmf_url, data=b"not json") as refused:
        assert refused.status == 400
    async with http.post(
        f"{server.url}/v1/realtime/calls/rtc_unknown/dtmf", json={"digits": "1"}
    ) as gone:
        assert gone.status == 404
    assert len(client.of_type("input_audio_buffer.dtmf_event_received")) == 5
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


def test_a_press_reported_both_ways_counts_once_and_repeats_still_count() -> None:
    now = [0.0]
    presses = KeyPresses(clock=lambda: now[0])
    assert presses.accept("5", "rtp")
    assert not presses.accept("5", "sip-info")  # the same press, the other way
    now[0] += 0.2
    assert presses.accept("5", "rtp")  # "55": a second press
    assert presses.accept("5", "rtp")  # sent one way only: never merged
    assert not presses.accept("5", "sip-info")  # matches one of them
    assert not presses.accept("5", "sip-info")  # and the other
    assert presses.accept("5", "sip-info")  # nothing left to match
    now[0] += 1.5  # an unmatched report is forgotten after a second
    assert presses.accept("5", "rtp")
    assert presses.accept("7", "sip-info")  # another key never matches


async def test_a_phone_that_only_listens_is_no_lost_peer_and_still_hears_the_agent(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    """What a SIP gateway reports of a re-INVITE with a=recvonly: the phone
    sends nothing from then on, which is no lost peer, and the agent is not
    on hold: it still speaks. Told the phone sends again, its silence ends
    the call as a lost peer's does."""
    server = await server_factory(disconnect_grace_s=1.0)
    client = RealtimeClient(server.url, codec="audio/PCMU")
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 5)
    hold_url = f"{server.url}{client.location}/hold"
    await client.mic.play(silence(0.5), 16000)  # the phone has sent audio

    async with http.post(hold_url, json={"held": False, "sending": False}) as told:
        assert told.status == 200
        answer = await told.json()
        assert (answer["held"], answer["sending"]) == (False, False)
    client.mic.stop_sending()
    await asyncio.sleep(3.0)  # three grace periods of silence, the condition under test
    async with http.get(f"{server.url}{client.location}") as live:
        assert live.status == 200
    started = client.wait_for_type("output_audio_buffer.started")
    done = client.wait_for_type("response.done")
    client.send({"type": "response.create", "response": {"instructions": "Say hello."}})
    await asyncio.wait_for(started, 30)
    assert (await asyncio.wait_for(done, 30))["response"]["status"] == "completed"

    async with http.post(hold_url, json={"held": False, "sending": "no"}) as refused:
        assert refused.status == 400
    async with http.post(hold_url, json={"held": False, "sending": True}) as told:
        assert (await told.json())["sending"] is True
    await asyncio.wait_for(server.calls.wait_for_count(0), 10)
    assert server.calls.ended.get("peer_lost") == 1


async def test_a_call_on_hold_neither_speaks_nor_listens_and_resumes_as_it_was(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    """What a SIP gateway reports of a re-INVITE with a=inactive: the reply
    stops, a phone that sends nothing is not a lost peer, and off hold the
    same conversation goes on."""
    server = await server_factory(disconnect_grace_s=1.0)
    client = RealtimeClient(server.url, codec="audio/PCMU")
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 5)
    hold_url = f"{server.url}{client.location}/hold"

    # A long reply is being spoken when the caller puts the agent on hold.
    started = client.wait_for_type("output_audio_buffer.started")
    done = client.wait_for_type("response.done")
    client.send(
        {
            "type": "response.create",
            "response": {"instructions": "Count slowly from one to fifty, in words."},
        }
    )
    await asyncio.wait_for(started, 30)
    async with http.post(hold_url, json={"held": True}) as held:
        assert held.status == 200 and (await held.json())["held"] is True
    response = (await asyncio.wait_for(done, 5))["response"]
    assert response["status"] == "cancelled"  # as an interruption: what was heard is kept

    # The phone sends nothing for three grace periods: the call lives on.
    client.mic.stop_sending()
    await asyncio.sleep(3.0)  # the silence under test, not a wait for a state
    client.mic.resume_sending()
    async with http.get(f"{server.url}{client.location}") as live:
        assert live.status == 200
    # Music on hold (here speech) is not a turn.
    await client.mic.play(np.concatenate((librivox("0930"), silence(1.0))), 16000)
    assert client.of_type("input_audio_buffer.speech_started") == []

    async with http.post(hold_url, json={"held": False}) as resumed:
        assert (await resumed.json())["held"] is False
    done = client.wait_for_type("response.done", after=len(client.events))
    await client.mic.play(np.concatenate((librivox("0930"), silence(0.3))), 16000)
    answer = (await asyncio.wait_for(done, 30))["response"]
    assert answer["status"] == "completed"
    assert len(client.of_type("input_audio_buffer.speech_started")) == 1

    for body in ({"held": "yes"}, {}, [True]):
        async with http.post(hold_url, json=body) as refused:
            assert refused.status == 400
    assert server.calls.ended == {} or "peer_lost" not in server.calls.ended
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)
