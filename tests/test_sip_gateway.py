"""Phone calls through the SIP gateway (deploy/sip/): a real SIP phone
(baresip) and SIPp call Kamailio + rtpengine, which bridge to the real
service, all inside a network namespace of the test's own
(voice_agent/testing/sip_lab.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from tests.conftest import test_settings as service_settings
from tests.stt_fixtures import load_stt
from voice_agent.audio.resample import StreamResampler
from voice_agent.backends.base import SttBackend
from voice_agent.testing.audio_data import librivox, reference, silence, word_error_rate
from voice_agent.testing.scripted_llm import Script, chat_text
from voice_agent.testing.sip_lab import PHONE, PHONE_RATE, SipLab, missing, sip_lab, start_gateway
from voice_agent.testing.sip_phone import Phone

REPLY = "The weather today is sunny and warm, with a light breeze."
INSTRUCTIONS = "You answer the phone. Caller (unverified): {caller_id}; dialled: {called_number}."

if (reason := missing()) is not None:
    pytest.skip(f"SIP gateway tests skipped: {reason}", allow_module_level=True)

pytestmark = [pytest.mark.e2e, pytest.mark.sip, pytest.mark.models, pytest.mark.slow]


def at_phone_rate(samples: np.ndarray) -> np.ndarray:
    return StreamResampler(16_000, PHONE_RATE).process(samples)


@pytest_asyncio.fixture(scope="module")
async def lab(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SipLab]:
    async with sip_lab(
        tmp_path_factory.mktemp("sip"),
        # '#' ends a call from the service's side: the hang-up digit hook.
        "--dtmf-hangup-digits",
        "#",
        "--llm-instructions",
        INSTRUCTIONS,
        # As deployed: only the trunk (here the phone's address) may call.
        gateway_settings={"SIP_ALLOWED_SOURCES": PHONE},
    ) as lab:
        yield lab


@pytest_asyncio.fixture(scope="module")
async def stt() -> AsyncIterator[SttBackend]:
    """The service's STT, here to transcribe what the phone heard."""
    backend = await load_stt(service_settings())
    yield backend
    backend.close()


@pytest_asyncio.fixture
async def phones(lab: SipLab) -> AsyncIterator[list[Phone]]:
    made: list[Phone] = []
    yield made
    for phone in made:
        await phone.stop()


async def new_phone(lab: SipLab, phones: list[Phone], name: str, mic: np.ndarray) -> Phone:
    phone = Phone(lab, name, mic)
    phones.append(phone)
    await phone.start()
    return phone


async def test_a_caller_is_heard_answered_and_hangs_up(
    lab: SipLab, phones: list[Phone], stt: SttBackend
) -> None:
    lab.llm.add(Script(chat_text(REPLY)))
    # The recording, then silence for the reply; at its end baresip hangs up.
    mic = np.concatenate((silence(1.0), librivox("0930"), silence(9.0)))
    phone = await new_phone(lab, phones, "caller", at_phone_rate(mic))
    await phone.dial()
    await phone.event("CALL_ESTABLISHED", 10)

    # The service transcribed the caller: the transcript went to the LLM.
    await asyncio.wait_for(lab.llm.arrived.wait(), 20)
    (_, body), *_ = lab.llm.requests
    said = body["messages"][-1]["content"]
    assert word_error_rate(reference("0930"), said) <= 0.25, said
    # Who called and which number, from the gateway, in the instructions.
    assert body["messages"][0] == {
        "role": "system",
        "content": "You answer the phone. Caller (unverified): caller; dialled: 5551234.",
    }

    # The caller hung up (BYE): the service call and the media relay ended.
    # The phone's RTCP BYE, relayed by rtpengine, may end the service call
    # (peer_bye) before the gateway's DELETE does (hangup).
    await phone.event("CALL_CLOSED", 30)
    await lab.service.log.wait_for(r"call closing .*reason=(hangup|peer_bye)", 10)
    await lab.wait_until_idle()

    # What the phone heard was the reply, through G.711 both ways.
    heard, rate = phone.heard()
    assert rate == PHONE_RATE
    assert int(np.abs(heard).max()) > 4000, "the phone heard silence"
    text = await stt.transcribe(StreamResampler(PHONE_RATE, 16_000).process(heard))
    assert word_error_rate(REPLY, text) <= 0.3, text
    assert lab.service.log.matching(r"call created")


async def test_key_presses_arrive_and_the_service_hanging_up_sends_a_bye(
    lab: SipLab, phones: list[Phone]
) -> None:
    dtmf_before = len(lab.service.log.matching(r"dtmf digit"))
    phone = await new_phone(lab, phones, "dtmf", at_phone_rate(silence(40.0)))
    await phone.dial()
    await phone.event("CALL_ESTABLISHED", 10)
    await phone.press("1")
    await phone.press("2")
    await lab.service.log.wait_for(r"dtmf digit", 10, count=dtmf_before + 2)
    assert not [e for e in phone.events if e.get("type") == "CALL_CLOSED"]

    # '#' is the hang-up digit: the service ends the call, the gateway sends BYE.
    await phone.press("#")
    closed = await phone.event("CALL_CLOSED", 10)
    digits = [m.group(1) for m in lab.service.log.matching(r"dtmf digit .*digit=([^\s\]]+)")]
    assert digits[dtmf_before:] == ["1", "2", "#"]
    await lab.service.log.wait_for(r"call closing .*reason=dtmf_hangup", 5)
    # baresip's words for a BYE from the far end (ECONNRESET), not a failure.
    assert closed["param"] == "Connection reset by peer"
    await lab.wait_until_idle()


async def test_an_invite_without_sdp_is_refused_with_488(lab: SipLab) -> None:
    calls_before = (await lab.stats())["calls_total"]
    code, output = await lab.sipp("invite_without_sdp.xml")
    assert code == 0, output
    assert (await lab.stats())["calls_total"] == calls_before  # never reached the service
    assert lab.media_calls() == []


async def test_a_cancel_before_the_answer_ends_both_legs(lab: SipLab) -> None:
    code, output = await lab.sipp("cancel_before_answer.xml")
    assert code == 0, output
    # A service call made while the caller gave up is deleted, not left to time out.
    await lab.wait_until_idle()


async def test_the_service_being_down_gets_the_caller_a_503(lab: SipLab, tmp_path: Path) -> None:
    # A second gateway, pointed at a port where nothing listens.
    gateway = await start_gateway(
        lab.namespace,
        tmp_path,
        "http://10.77.0.3:9",
        sip_port=5062,
        ng_port=2224,
        rtp_ports=(31000, 31099),
    )
    try:
        code, output = await lab.sipp("service_down.xml", port=5062)
        assert code == 0, output
        assert lab.media_calls(gateway) == []  # rtpengine forgot the offer
        assert gateway.process.log.matching(r"the service is unreachable")
    finally:
        await gateway.process.stop()
    assert gateway.process.process.returncode is not None
