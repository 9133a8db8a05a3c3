"""The caller's audio goes to the decoder as it arrives: in order, at once,
late and duplicated packets dropped; and is decoded on the event loop."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import aiohttp
import numpy as np
import pytest
from aiortc.jitterbuffer import JitterBuffer
from aiortc.rtp import RtpPacket

from tests.conftest import ServerFactory
from voice_agent.client import RealtimeClient
from voice_agent.rtc import opus_wideband
from voice_agent.rtc.arrival_order import ATTRIBUTE, ArrivalOrderBuffer
from voice_agent.rtc.call import Call
from voice_agent.rtc.inline_decoding import InlineDecoder
from voice_agent.testing.audio_data import librivox, reference, silence, word_error_rate


def packet(sequence: int, timestamp: int, ssrc: int = 1234) -> RtpPacket:
    made = RtpPacket(payload_type=111, sequence_number=sequence, timestamp=timestamp, ssrc=ssrc)
    made._data = f"opus-{sequence}".encode()  # type: ignore[attr-defined]  # as depayloaded
    return made


def released(buffer: ArrivalOrderBuffer, sequence: int) -> bytes | None:
    pli, frame = buffer.add(packet(sequence, sequence * 960))
    assert pli is False
    return None if frame is None else frame.data


def test_each_packet_is_released_on_arrival_with_its_timestamp() -> None:
    buffer = ArrivalOrderBuffer()
    for sequence in range(5):
        _, frame = buffer.add(packet(sequence, sequence * 960))
        assert frame is not None and frame.data == f"opus-{sequence}".encode()
        assert frame.timestamp == sequence * 960
    # aiortc's own holds the first frame until 4 newer ones have arrived.
    stock = JitterBuffer(capacity=16, prefetch=4)
    assert [stock.add(packet(s, s * 960))[1] is None for s in range(5)] == [True] * 4 + [False]


def test_a_gap_costs_only_the_lost_packet_and_late_or_repeated_ones_are_dropped() -> None:
    buffer = ArrivalOrderBuffer()
    assert released(buffer, 10) == b"opus-10"
    assert released(buffer, 12) == b"opus-12"  # 11 lost: 12 goes on at once
    assert released(buffer, 11) is None  # 11 arrives late: dropped
    assert released(buffer, 12) is None  # a duplicate
    assert released(buffer, 13) == b"opus-13"
    assert buffer.dropped == 2


def test_sequence_numbers_wrap_and_a_restarted_stream_is_followed() -> None:
    buffer = ArrivalOrderBuffer()
    assert released(buffer, 65534) == b"opus-65534"
    assert released(buffer, 65535) == b"opus-65535"
    assert released(buffer, 0) == b"opus-0"
    assert released(buffer, 65535) is None
    # Far behind: a new sender (another phone after a transfer), not a late packet.
    assert released(buffer, 30000) == b"opus-30000"
    assert released(buffer, 30001) == b"opus-30001"
    assert released(buffer, 29950) is None  # 51 behind: late
    assert released(buffer, 29900) == b"opus-29900"  # 101 behind: a restart


def test_a_new_source_is_followed_even_just_behind_the_last_number() -> None:
    buffer = ArrivalOrderBuffer()
    assert buffer.add(packet(500, 0))[1] is not None
    # Another SSRC starting 10 below: its own stream, not 10 late packets.
    frame = buffer.add(packet(490, 7777, ssrc=99))[1]
    assert frame is not None and frame.timestamp == 7777
    assert buffer.add(packet(491, 8737, ssrc=99))[1] is not None
    assert buffer.dropped == 0


async def check_receiver_of_a_heard_call(
    server_factory: ServerFactory,
    http: aiohttp.ClientSession,
    check: Callable[[Any], None],
    **settings: bool,
) -> None:
    """A real call with these settings speaks one sentence and is heard
    (WER <= 0.15); then ``check`` looks at the server's audio receiver,
    while the call is still up."""
    server = await server_factory(**settings)
    client = RealtimeClient(server.url)
    await client.connect(http)
    try:
        transcribed = client.wait_for_type("conversation.item.input_audio_transcription.completed")
        await client.mic.play(np.concatenate((librivox("0930"), silence(0.7))), 16000)
        transcript = (await asyncio.wait_for(transcribed, 30))["transcript"]
        assert word_error_rate(reference("0930"), transcript) <= 0.15
        (call,) = server.calls.calls()
        assert isinstance(call, Call)
        (transceiver,) = call.pc.getTransceivers()
        check(transceiver.receiver)
    finally:
        await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


@pytest.mark.parametrize("playout_buffer", [False, True])
async def test_a_call_hears_the_caller_through_the_buffer_it_was_given(
    server_factory: ServerFactory, http: aiohttp.ClientSession, playout_buffer: bool
) -> None:
    def check(receiver: Any) -> None:
        buffer = getattr(receiver, ATTRIBUTE)
        if playout_buffer:
            assert isinstance(buffer, JitterBuffer)
        else:
            assert isinstance(buffer, ArrivalOrderBuffer) and buffer.dropped == 0

    await check_receiver_of_a_heard_call(
        server_factory, http, check, input_playout_buffer=playout_buffer
    )


@pytest.mark.parametrize(
    ("decoder_thread", "opus_16k"), [(False, True), (False, False), (True, True)]
)
async def test_the_caller_is_heard_with_the_decoder_inline_or_in_its_thread(
    server_factory: ServerFactory, http: aiohttp.ClientSession, decoder_thread: bool, opus_16k: bool
) -> None:
    def check(receiver: Any) -> None:
        decoder_queue = getattr(receiver, "_RTCRtpReceiver__decoder_queue")  # noqa: B009
        assert isinstance(decoder_queue, InlineDecoder) is not decoder_thread
        if not decoder_thread:  # Opus inline: straight to 16 kHz mono, unless asked not to
            assert (decoder_queue._wideband is not None) is (opus_16k and opus_wideband.available())
        # The receiver still starts its thread; given the inline decoder it returns at once.
        thread = getattr(receiver, "_RTCRtpReceiver__decoder_thread")  # noqa: B009
        assert isinstance(thread, threading.Thread)
        assert thread.is_alive() is decoder_thread

    await check_receiver_of_a_heard_call(
        server_factory, http, check, input_decoder_thread=decoder_thread, input_opus_16k=opus_16k
    )
