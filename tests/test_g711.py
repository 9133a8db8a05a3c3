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
