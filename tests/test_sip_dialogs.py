"""What a trunk sends within a call, through the SIP gateway (deploy/sip/dialogs.py):
hold and resume by re-INVITE, a codec change refused, session timers
(RFC 4028), key presses by SIP INFO.

The gateway's plain functions (SDP directions, formats and versions, INFO
bodies, Session-Expires) are tested on their own, fast and without the lab;
the rest with SIPp through the real gateway to the real service, in the lab's
network namespace (voice_agent/testing/sip_lab.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import pytest
import pytest_asyncio

# The lab by its module's name: conftest marks every test of a module that
# has `sip_lab` itself as a SIP lab test; here only those `on_the_lab` are.
import voice_agent.testing.sip_lab as lab_tools
from voice_agent.testing.sip_lab import PHONE, Gateway, SipLab, SippRun


def load_dialogs() -> ModuleType:
    """The gateway's in-dialog module (deploy/sip/dialogs.py; not a package:
    it imports its neighbours as Kamailio loads it, from its own folder)."""
    folder = str(lab_tools.GATEWAY_SCRIPT.parent)
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(
        "sip_dialogs", lab_tools.GATEWAY_SCRIPT.parent / "dialogs.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


dialogs = load_dialogs()

# -- the plain functions ---------------------------------------------------------

# rtpengine's answer to a phone, as the gateway keeps it.
ANSWER = (
    "v=0\r\no=- 4005463879 4005463879 IN IP4 10.77.0.1\r\ns=-\r\nt=0 0\r\n"
    "a=msid-semantic:WMS *\r\nm=audio 30012 RTP/AVP 0 101\r\nc=IN IP4 10.77.0.1\r\n"
    "a=rtpmap:0 PCMU/8000\r\na=rtpmap:101 telephone-event/8000\r\na=fmtp:101 0-15\r\n"
    "a=sendrecv\r\na=rtcp:30013\r\n"
)


def offer(
    direction: str = "",
    formats: str = "0 8 101",
    address: str = "192.0.2.7",
    port: int = 6000,
    session_direction: str = "",
) -> str:
    """A phone's offer, with a direction at the media or the session level."""
    lines = [
        "v=0",
        "o=phone 1 2 IN IP4 192.0.2.7",
        "s=-",
        f"c=IN IP4 {address}",
        "t=0 0",
        *([f"a={session_direction}"] if session_direction else []),
        f"m=audio {port} RTP/AVP {formats}",
        "a=rtpmap:0 PCMU/8000",
        "a=rtpmap:8 PCMA/8000",
        "a=rtpmap:101 telephone-event/8000",
        *([f"a={direction}"] if direction else []),
    ]
    return "\n".join(lines) + "\n"  # a phone's bare LFs: read all the same


def version_of(sdp: str) -> int:
    return int(dialogs.origin_of(sdp).split()[2])


def answer_direction(sdp: str) -> str:
    found = re.findall(r"^a=(sendrecv|sendonly|recvonly|inactive)\r?$", sdp, re.M)
    assert len(found) == 1, sdp
    return str(found[0])


@pytest.mark.parametrize(
    ("sdp", "direction"),
    [
        (offer(), "sendrecv"),
        (offer("sendonly"), "sendonly"),
        (offer("inactive"), "inactive"),
        (offer("recvonly"), "recvonly"),
        (offer(session_direction="sendonly"), "sendonly"),
        # The media's own attribute wins over the session's.
        (offer("sendrecv", session_direction="inactive"), "sendrecv"),
        # RFC 2543's hold: the address 0.0.0.0.
        (offer(address="0.0.0.0"), "sendonly"),
        (offer("recvonly", address="0.0.0.0"), "inactive"),
        (offer("inactive", address="0.0.0.0"), "inactive"),
    ],
)
def test_the_direction_an_offer_asks_for(sdp: str, direction: str) -> None:
    assert dialogs.direction_of(sdp) == direction


def test_answers_complement_the_offer_and_count_their_versions() -> None:
    last = dialogs.normalized(ANSWER)
    seen: list[tuple[str, int]] = []
    for direction in ("", "sendonly", "inactive", "recvonly", "sendrecv", "sendrecv"):
        answer = dialogs.next_answer(ANSWER, last, offer(direction))
        assert answer is not None
        seen.append((answer_direction(answer), version_of(answer)))
        last = answer
    first = version_of(ANSWER)
    assert seen == [
        ("sendrecv", first),  # nothing changed: the same version (RFC 3264 section 8)
        ("recvonly", first + 1),
        ("inactive", first + 2),
        ("sendonly", first + 3),
        ("sendrecv", first + 4),
        ("sendrecv", first + 4),
    ]
    # The rest of the SDP is rtpengine's, untouched.
    assert last.replace(f" {first + 4} IN", f" {first} IN") == dialogs.normalized(ANSWER)


def test_the_old_hold_is_answered_recvonly() -> None:
    answer = dialogs.next_answer(ANSWER, ANSWER, offer(address="0.0.0.0"))
    assert answer is not None and answer_direction(answer) == "recvonly"
    assert dialogs.direction_of(offer("sendonly")) in dialogs.HELD
    assert dialogs.direction_of(offer("recvonly")) not in dialogs.HELD


def test_a_session_level_direction_in_our_answer_is_replaced() -> None:
    sdp = ANSWER.replace("t=0 0\r\n", "t=0 0\r\na=sendrecv\r\n").replace(
        "a=sendrecv\r\na=rtcp", "a=rtcp"
    )
    answer = dialogs.with_direction(sdp, "recvonly")
    assert answer_direction(answer) == "recvonly"
    assert answer.index("a=recvonly") > answer.index("m=audio")


def test_an_offer_without_the_calls_codec_gets_no_answer() -> None:
    assert dialogs.codec_of(ANSWER) == ("0", "pcmu/8000")
    assert dialogs.next_answer(ANSWER, ANSWER, offer(formats="8 101")) is None
    # PCMU under another payload type is no offer of the call's format.
    renumbered = offer(formats="96 101").replace("a=rtpmap:0 PCMU", "a=rtpmap:96 PCMU")
    assert dialogs.next_answer(ANSWER, ANSWER, renumbered) is None
    # Listed, even after PCMA: answered with PCMU, as before.
    answer = dialogs.next_answer(ANSWER, ANSWER, offer(formats="8 0 101"))
    assert answer == dialogs.normalized(ANSWER)


def test_an_answer_lists_only_formats_the_offer_still_lists() -> None:
    without_events = dialogs.next_answer(ANSWER, ANSWER, offer(formats="0"))
    assert without_events is not None
    assert "m=audio 30012 RTP/AVP 0\r\n" in without_events
    assert "telephone-event" not in without_events and "a=fmtp:101" not in without_events
    assert version_of(without_events) == version_of(ANSWER) + 1
    # Offered again, telephone-event is back (from the first answer).
    again = dialogs.next_answer(ANSWER, without_events, offer())
    assert again is not None and "m=audio 30012 RTP/AVP 0 101\r\n" in again
    assert version_of(again) == version_of(ANSWER) + 2


def test_where_an_offer_sends_the_audio() -> None:
    first = dialogs.media_target(offer())
    assert first == ("192.0.2.7", 6000)
    assert not dialogs.moved(first, dialogs.media_target(offer("sendonly")))
    assert not dialogs.moved(first, dialogs.media_target(offer(address="0.0.0.0")))
    assert dialogs.moved(first, dialogs.media_target(offer(port=6002)))
    assert dialogs.moved(first, dialogs.media_target(offer(address="192.0.2.8")))
    assert dialogs.media_target(offer(port=0)) == ("192.0.2.7", 0)
    assert dialogs.media_target("v=0\r\ns=-\r\n") is None
    # rtpengine reads "40000x" as 40000; this side refuses it before anything
    # is set up, rather than failing once the call is made.
    for port in ("40000x", "٤٠٠٠٠", "²"):
        with pytest.raises(ValueError):
            dialogs.media_target(offer().replace("m=audio 6000 ", f"m=audio {port} "))


def test_a_version_goes_up_by_one() -> None:
    assert version_of(dialogs.with_next_version(ANSWER)) == 4005463880
    assert dialogs.normalized(dialogs.normalized(ANSWER)) == dialogs.normalized(ANSWER)


@pytest.mark.parametrize(
    ("content_type", "body", "key"),
    [
        ("application/dtmf-relay", "Signal=5\r\nDuration=160\r\n", "5"),
        ("application/dtmf-relay", "Signal= 5\r\nDuration= 160\r\n", "5"),
        ("Application/DTMF-Relay; charset=utf-8", "signal=*\nduration=100\n", "*"),
        ("application/dtmf-relay", "Signal=10\r\nDuration=160\r\n", "*"),
        ("application/dtmf-relay", "Signal=11\r\nDuration=160\r\n", "#"),
        ("application/dtmf-relay", "Signal=#\r\n", "#"),
        ("application/dtmf-relay", "Signal=12\r\n", "A"),
        ("application/dtmf-relay", "Signal=d\r\n", "D"),
        ("application/dtmf", "5", "5"),
        ("application/dtmf", "10\r\n", "*"),
        ("application/dtmf", "11", "#"),
        ("application/dtmf", "0", "0"),
        ("", "", ""),  # a keep-alive
        ("application/dtmf-relay", "\r\n", ""),
        ("text/plain", "", ""),
    ],
)
def test_the_key_an_info_reports(content_type: str, body: str, key: str) -> None:
    assert dialogs.info_key(content_type, body) == key


@pytest.mark.parametrize(
    ("content_type", "body", "error"),
    [
        ("text/plain", "hello", "UnsupportedInfo"),
        ("application/json", '{"digit": "5"}', "UnsupportedInfo"),
        ("", "5", "UnsupportedInfo"),
        ("application/dtmf-relay", "Duration=160\r\n", "ValueError"),
        ("application/dtmf-relay", "Signal=16\r\n", "ValueError"),
        ("application/dtmf-relay", "Signal=55\r\n", "ValueError"),
        ("application/dtmf", "x", "ValueError"),
        ("application/dtmf", "-1", "ValueError"),
    ],
)
def test_an_info_without_a_key_is_refused(content_type: str, body: str, error: str) -> None:
    with pytest.raises(ValueError) as raised:
        dialogs.info_key(content_type, body)
    assert (type(raised.value).__name__ == "UnsupportedInfo") == (error == "UnsupportedInfo")


@pytest.mark.parametrize(
    ("session_expires", "supported", "interval", "too_small"),
    [
        ("1800", "timer", 1800, False),
        ("90;refresher=uac", "100rel, timer", 90, False),
        (" 600 ; refresher=UAC", "TIMER", 600, False),
        ("30", "timer", 0, True),
        ("89;refresher=uac", "timer", 0, True),
        # The phone asks the gateway to refresh, or does not refresh itself:
        # no timer (the gateway sends no refreshes of its own).
        ("1800;refresher=uas", "timer", 0, False),
        ("1800", "", 0, False),
        ("30", "100rel", 0, False),
        ("", "timer", 0, False),
        ("soon", "timer", 0, False),
    ],
)
def test_session_timers_are_agreed(
    session_expires: str, supported: str, interval: int, too_small: bool
) -> None:
    tags = dialogs.option_tags([supported])
    timer = dialogs.negotiate_timer(session_expires, tags, 90)
    assert (timer.interval, timer.too_small) == (interval, too_small)
    if interval:
        assert timer.headers() == (
            f"Session-Expires: {interval};refresher=uac\r\nRequire: timer\r\n"
        )
    else:
        assert timer.headers() == ""


def test_an_unrefreshed_session_ends_before_it_expires() -> None:
    # RFC 4028 section 10: a third of the interval early, at most 32 s.
    assert dialogs.bye_after(90) == 60
    assert dialogs.bye_after(1800) == 1768
    call = {"timer": 90, "refreshed": 1000.0}
    assert not dialogs.expired(call, 1059.5)
    assert dialogs.expired(call, 1060.0)
    assert not dialogs.expired({"timer": 0, "refreshed": 0.0}, 1e9)
    assert dialogs.option_tags(["timer, 100rel", "replaces"]) == {"timer", "100rel", "replaces"}


# -- through the lab -------------------------------------------------------------

LAB_MISSING = lab_tools.missing()
Test = TypeVar("Test", bound=Callable[..., Any])


def on_the_lab(test: Test) -> Test:
    """A test through the SIP lab: its marks, and skipped without the lab."""
    for mark in (
        pytest.mark.e2e,
        pytest.mark.sip,
        pytest.mark.models,
        pytest.mark.slow,
        pytest.mark.skipif(
            LAB_MISSING is not None, reason=f"SIP gateway tests skipped: {LAB_MISSING}"
        ),
    ):
        test = mark(test)
    return test


# A gateway whose Min-SE is short, so that session timers run out in seconds.
SHORT_PORT, SHORT_MIN_SE = 5062, 10


@pytest_asyncio.fixture(scope="module")
async def lab(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SipLab]:
    async with lab_tools.sip_lab(
        tmp_path_factory.mktemp("sip-dialogs"),
        gateway_settings={"SIP_ALLOWED_SOURCES": PHONE},
    ) as lab:
        yield lab


@pytest_asyncio.fixture(scope="module")
async def short_timers(
    lab: SipLab, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    gateway = await lab_tools.start_gateway(
        lab.namespace,
        tmp_path_factory.mktemp("sip-short-timers"),
        lab.service_url,
        sip_port=SHORT_PORT,
        ng_port=2224,
        rtp_ports=(31000, 31099),
        settings={"SIP_ALLOWED_SOURCES": PHONE, "SIP_MIN_SE": str(SHORT_MIN_SE)},
    )
    yield gateway
    await gateway.process.stop()


async def traced(
    lab: SipLab, scenario: str, *args: str, gateway: Gateway | None = None
) -> tuple[SippRun, list[tuple[str, str, str]]]:
    """A SIPp run, and the replies it received: (CSeq, head, body) each."""
    trace = lab.workdir / f"{scenario}.messages"
    trace.unlink(missing_ok=True)
    port = gateway.sip_port if gateway else lab.gateway.sip_port
    run = await lab.sipp_run(
        scenario,
        "-trace_msg",
        "-message_file",
        str(trace),
        *args,
        port=port,
        gateway=gateway,
    )
    return run, received_replies(trace)


def received_replies(trace: Path) -> list[tuple[str, str, str]]:
    replies = []
    if not trace.exists():
        return []
    for block in re.split(r"^-{20,}.*$", trace.read_text(), flags=re.M):
        head, _, message = block.strip().partition("\n")
        message = message.strip()
        if "message received" not in head or not message.startswith("SIP/2.0"):
            continue
        headers, _, body = message.replace("\r\n", "\n").partition("\n\n")
        cseq = re.search(r"^CSeq:\s*(.+)$", headers, re.M)
        replies.append((cseq.group(1).strip() if cseq else "", headers, body))
    return replies


def finals(replies: list[tuple[str, str, str]], method: str) -> list[tuple[str, str, str]]:
    """The final replies to ``method``, each once (SIPp traces retransmissions too)."""
    seen: dict[str, tuple[str, str, str]] = {}
    for cseq, headers, body in replies:
        if cseq.endswith(f" {method}") and not headers.startswith("SIP/2.0 1"):
            seen.setdefault(cseq, (headers.split("\n", 1)[0], headers, body))
    return list(seen.values())


async def until_idle(lab: SipLab, gateway: Gateway | None = None) -> None:
    """No call left in the service or in either gateway's rtpengine."""
    await lab.wait_until_idle()
    if gateway is not None:
        async with asyncio.timeout(10):
            while lab.media_calls(gateway):  # noqa: ASYNC110 (another process's state)
                await asyncio.sleep(0.2)


def packets_within(sock: socket.socket, seconds: float) -> int:
    """How many datagrams reach ``sock`` within ``seconds`` (from now on:
    those that came before are let go first)."""
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            sock.recv(2048)
    count, end = 0, time.monotonic() + seconds
    sock.settimeout(0.1)
    while time.monotonic() < end:
        with contextlib.suppress(TimeoutError):
            sock.recv(2048)
            count += 1
    return count


@on_the_lab
async def test_hold_and_resume_by_reinvite(lab: SipLab) -> None:
    held, resumed = (len(lab.service.log.matching(rf"call {word}")) for word in ("held", "resumed"))
    port = 6012  # the phone's audio: SIPp's own media sockets are 6000-6003
    sock = lab.namespace.new_socket(socket.SOCK_DGRAM)
    with sock:
        sock.bind((PHONE, port))
        call = asyncio.create_task(
            traced(lab, "hold_resume.xml", "-key", "phone_port", str(port), "-d", "2000")
        )
        try:
            # Answered recvonly, the gateway sends the phone nothing (RFC 3264) ...
            await lab.gateway.process.log.wait_for(r"held by the caller", 10)
            await asyncio.sleep(0.2)  # what was on its way
            on_hold = await asyncio.to_thread(packets_within, sock, 1.0)
            # ... and off hold the agent's audio flows again.
            await lab.gateway.process.log.wait_for(r"resumed by the caller", 10)
            off_hold = await asyncio.to_thread(packets_within, sock, 1.0)
        finally:
            run, replies = await call
    assert run.code == 0, run.output
    assert (on_hold, off_hold >= 20) == (0, True), (on_hold, off_hold)
    answers = finals(replies, "INVITE")
    assert [status for status, _, _ in answers] == ["SIP/2.0 200 OK"] * 6, run.output
    first = version_of(answers[0][2])
    assert [(answer_direction(body), version_of(body) - first) for _, _, body in answers] == [
        ("sendrecv", 0),
        ("recvonly", 1),  # sendonly: on hold
        ("inactive", 2),
        ("recvonly", 3),  # c=0.0.0.0: on hold, the old way
        ("sendrecv", 4),  # off hold
        ("sendrecv", 4),  # the same offer again: the same answer
    ]
    # The service was told once each way (inactive and 0.0.0.0 are still on hold).
    await lab.service.log.wait_for(r"call resumed", 5, count=resumed + 1)
    assert len(lab.service.log.matching(r"call held")) == held + 1
    assert len(lab.service.log.matching(r"call resumed")) == resumed + 1
    await until_idle(lab)


@on_the_lab
async def test_a_phone_that_only_listens_still_hears_the_agent(lab: SipLab) -> None:
    """recvonly is no hold: answered sendonly, the agent's audio still
    reaches the phone, and the service is told the phone sends nothing (its
    silence is then no lost peer), then that it sends again."""
    quiet, sending = (
        len(lab.service.log.matching(pattern))
        for pattern in (r"caller sends no audio", r"caller sends audio\b")
    )
    held = len(lab.service.log.matching(r"call held"))
    port = 6014  # the phone's audio: SIPp's own media sockets are 6000-6003
    sock = lab.namespace.new_socket(socket.SOCK_DGRAM)
    with sock:
        sock.bind((PHONE, port))
        call = asyncio.create_task(
            traced(lab, "listen_only.xml", "-key", "phone_port", str(port), "-d", "2000")
        )
        try:
            await lab.service.log.wait_for(r"caller sends no audio", 10, count=quiet + 1)
            listening = await asyncio.to_thread(packets_within, sock, 1.0)
        finally:
            run, replies = await call
    assert run.code == 0, run.output
    assert listening >= 20, listening  # 20 ms packets: not blocked as a held call's are
    answers = finals(replies, "INVITE")
    assert [answer_direction(body) for _, _, body in answers] == [
        "sendrecv",
        "sendonly",
        "sendrecv",
    ]
    await lab.service.log.wait_for(r"caller sends audio\b", 5, count=sending + 1)
    assert len(lab.service.log.matching(r"call held")) == held
    await until_idle(lab)


@on_the_lab
async def test_a_codec_change_is_refused_and_the_call_goes_on(lab: SipLab) -> None:
    before = (await lab.stats())["calls_total"]
    run, replies = await traced(lab, "codec_change.xml", "-d", "300")
    assert run.code == 0, run.output
    statuses = [status for status, _, _ in finals(replies, "INVITE")]
    assert statuses == [
        "SIP/2.0 200 OK",
        "SIP/2.0 488 Not Acceptable Here (the call's codec is required)",
        "SIP/2.0 200 OK",
    ]
    first, _, last = finals(replies, "INVITE")
    assert last[2] == first[2]  # the same answer: nothing changed, its version neither
    assert [status for status, _, _ in finals(replies, "BYE")] == ["SIP/2.0 200 OK"]
    assert (await lab.stats())["calls_total"] == before + 1
    await until_idle(lab)


@on_the_lab
async def test_a_reinvite_moves_the_audio_and_the_service_side_stays(lab: SipLab) -> None:
    new_port = 6010  # SIPp's own media sockets are 6000-6003
    sock = lab.namespace.new_socket(socket.SOCK_DGRAM)
    with sock:
        sock.bind((PHONE, new_port))
        call = asyncio.create_task(
            traced(lab, "media_move.xml", "-key", "new_port", str(new_port), "-d", "2500")
        )
        try:
            moved = await lab.gateway.process.log.wait_for(
                rf"call (\S+): its audio moved to {PHONE}:{new_port}", 10
            )
            # The agent's audio (the service sends even silence) now reaches the new port.
            assert await asyncio.to_thread(packets_within, sock, 1.0) >= 20
        finally:
            run, replies = await call
    assert run.code == 0, run.output
    first, again = (body for _, _, body in finals(replies, "INVITE"))
    assert again == first  # the gateway's side did not move: the same SDP, version and all
    # The service never saw a thing: one ICE + DTLS connection, up until the BYE.
    call_id = moved[0].group(1)
    service_call = lab.gateway.process.log.matching(
        rf"call {re.escape(call_id)} from trunk .* service call \S+/(\S+)"
    )[0].group(1)
    states = lab.service.log.matching(
        rf"peer connection state \[call_id={service_call} state=(\w+)"
    )
    assert [state.group(1) for state in states][:2] == ["connecting", "connected"]
    assert "connecting" not in [state.group(1) for state in states][2:]
    await lab.service.log.wait_for(
        rf"call closing \[call_id={service_call} reason=(hangup|peer_bye)", 5
    )
    await until_idle(lab)


@on_the_lab
async def test_session_timers_are_agreed_and_refreshed(lab: SipLab) -> None:
    run, replies = await traced(lab, "session_refresh.xml", "-key", "se", "90", "-d", "200")
    assert run.code == 0, run.output
    answered = finals(replies, "INVITE") + finals(replies, "UPDATE")
    assert len(answered) == 4, run.output
    for status, headers, _ in answered:
        assert status == "SIP/2.0 200 OK"
        assert re.search(r"^Session-Expires: 90;refresher=uac$", headers, re.M), headers
        assert re.search(r"^Require: timer$", headers, re.M), headers
    await until_idle(lab)


@on_the_lab
async def test_a_call_refreshed_at_half_its_interval_outlives_it(
    lab: SipLab, short_timers: Gateway
) -> None:
    # Session-Expires 10: unrefreshed, the gateway would end it after 6.7 s;
    # refreshed every 5 s (UPDATE, re-INVITE, UPDATE) it lasts 15 s.
    started = time.monotonic()
    run, _ = await traced(
        lab,
        "session_refresh.xml",
        "-key",
        "se",
        str(SHORT_MIN_SE),
        "-d",
        str(SHORT_MIN_SE * 1000 // 2),
        "-timeout",
        "28s",
        gateway=short_timers,
    )
    assert run.code == 0, run.output
    assert time.monotonic() - started >= 2 * dialogs.bye_after(SHORT_MIN_SE)
    assert not short_timers.process.log.matching(r"session timer ran out")
    await until_idle(lab, short_timers)


@on_the_lab
async def test_an_unrefreshed_call_is_ended_by_the_gateway(
    lab: SipLab, short_timers: Gateway
) -> None:
    started = time.monotonic()
    run = await lab.sipp_run(
        "session_unrefreshed.xml",
        "-key",
        "se",
        str(SHORT_MIN_SE),
        port=SHORT_PORT,
        gateway=short_timers,
    )
    took = time.monotonic() - started
    assert run.code == 0, run.output
    # The BYE came before the interval ran out, not before the gateway's deadline.
    assert dialogs.bye_after(SHORT_MIN_SE) - 0.5 <= took < SHORT_MIN_SE + 1, took
    await short_timers.process.log.wait_for(r"session timer ran out", 5)
    await lab.service.log.wait_for(r"call closing .*reason=(hangup|peer_bye)", 5)
    await until_idle(lab, short_timers)


@on_the_lab
async def test_the_bye_goes_to_the_contact_of_the_latest_refresh(
    lab: SipLab, short_timers: Gateway
) -> None:
    # The scenario fails unless the gateway's BYE names the UPDATE's Contact.
    run = await lab.sipp_run(
        "target_refresh.xml", "-key", "se", str(SHORT_MIN_SE), port=SHORT_PORT, gateway=short_timers
    )
    assert run.code == 0, run.output
    await short_timers.process.log.wait_for(r"session timer ran out", 5)
    await until_idle(lab, short_timers)


@on_the_lab
async def test_a_session_interval_below_min_se_gets_422(lab: SipLab) -> None:
    before = (await lab.stats())["calls_total"]
    run = await lab.sipp_run("session_too_small.xml", "-key", "se", "30")
    assert run.code == 0, run.output
    assert (await lab.stats())["calls_total"] == before  # never reached the service
    assert lab.media_calls() == []


@on_the_lab
async def test_key_presses_by_sip_info(lab: SipLab) -> None:
    pattern = r"dtmf digit .*way=sip-info"
    before = len(lab.service.log.matching(pattern))
    run = await lab.sipp_run("info_dtmf.xml")
    assert run.code == 0, run.output
    await lab.service.log.wait_for(pattern, 5, count=before + 4)
    lines = [match.string for match in lab.service.log.matching(pattern)][before:]
    digits = [re.search(r"digit=([^\s\]]+)", line).group(1) for line in lines]  # type: ignore[union-attr]
    assert digits == ["5", "#", "7", "*"]
    await until_idle(lab)
