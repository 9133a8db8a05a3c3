"""The SIP gateway's defences against callers on the open internet, with real
SIP (SIPp) through the real gateway (Kamailio + rtpengine) to the real
service, in the lab's network namespace (voice_agent/testing/sip_lab.py):

- a source that is no trunk gets 403, and neither rtpengine nor the service
  hears of it;
- a trunk known by digest credentials is challenged (407), refused with
  wrong ones and answered with the right ones (and may REGISTER); its
  answer, replayed from another address, is challenged again;
- a source that floods is dropped unanswered, for a while, while another
  trunk's call goes through;
- a trunk at its own call limit gets 503 with Retry-After, while another
  trunk's call is answered: one trunk cannot take the service's call slots;
- so does a trunk over its own new calls a minute: one trunk cannot use up
  the service's budget of new calls from the gateway either;
- an INVITE the gateway cannot read whole is refused before anything is set
  up (it used to leave the service's call up, its trunk slot given back);
- audio sent to a call's relay port from an address not the caller's is
  not heard by the agent.

The lab's gateway lists three trunks by address (A: the phone's, B and C);
the service takes at most two calls, so without the per-trunk limit trunk A
alone could take both.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import socket
import struct
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from voice_agent.audio.resample import StreamResampler
from voice_agent.rtc.g711 import encoder_for
from voice_agent.testing.audio_data import heard_as_its_own, librivox
from voice_agent.testing.sip_lab import (
    FLOODER,
    GATEWAY,
    GATEWAY_SCRIPT,
    NUMBER,
    PHONE,
    STRANGER,
    TRUNK_B,
    TRUNK_C,
    Gateway,
    SipLab,
    missing,
    sip_lab,
    start_gateway,
)

if (reason := missing()) is not None:
    pytest.skip(f"SIP gateway tests skipped: {reason}", allow_module_level=True)

pytestmark = [pytest.mark.e2e, pytest.mark.sip, pytest.mark.models, pytest.mark.slow]

PASSWORD = "correct-horse-battery-staple"
DIGEST_PORT = 5062
FLOOD_CALLS = 400
# The default rate (30 requests per 2 s), over a 1 s interval: pike then lets
# a source go about a second after its flood stops, well before the ban
# (BLOCK_S) ends, so the test sees the ban itself.
FLOOD_REQUESTS, FLOOD_INTERVAL_S, BLOCK_S = 15, 1, 8
# pike turns a source red after between x and 3x of its requests (its tree of
# address bytes fills first): no more than that of the flood may be answered.
FLOOD_ANSWERED_AT_MOST = 3 * FLOOD_REQUESTS + 10
GATEWAY_SETTINGS = {
    "SIP_ALLOWED_SOURCES": f"trunk-a={PHONE},trunk-b={TRUNK_B},trunk-c={TRUNK_C}",
    "SIP_MAX_CALLS_PER_TRUNK": "trunk-a=1",
    "SIP_CALLS_PER_MINUTE_PER_TRUNK": "trunk-c=2",
    "SIP_FLOOD_REQUESTS": str(FLOOD_REQUESTS),
    "SIP_FLOOD_INTERVAL_S": str(FLOOD_INTERVAL_S),
    "SIP_FLOOD_BLOCK_S": str(BLOCK_S),
}


@pytest_asyncio.fixture(scope="module")
async def lab(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[SipLab]:
    async with sip_lab(
        tmp_path_factory.mktemp("sip-security"),
        "--max-calls",
        "2",
        gateway_settings=GATEWAY_SETTINGS,
    ) as lab:
        yield lab


@pytest_asyncio.fixture(scope="module")
async def digest_gateway(
    lab: SipLab, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Gateway]:
    """A second gateway whose trunk "pbx" is known by its password, not its address."""
    workdir = tmp_path_factory.mktemp("sip-digest")
    users = workdir / "users"
    users.write_text(f"# trunks that authenticate\npbx:{PASSWORD}\n")
    gateway = await start_gateway(
        lab.namespace,
        workdir,
        lab.service_url,
        sip_port=DIGEST_PORT,
        ng_port=2224,
        rtp_ports=(31000, 31099),
        settings={"SIP_AUTH_FILE": str(users), "SIP_ALLOWED_SOURCES": f"trunk-a={PHONE}"},
    )
    yield gateway
    await gateway.process.stop()


async def calls_total(lab: SipLab) -> int:
    total: int = (await lab.stats())["calls_total"]
    return total


async def test_a_source_that_is_no_trunk_gets_403_and_nothing_is_set_up(lab: SipLab) -> None:
    before = await calls_total(lab)
    run = await lab.sipp_run("refused_403.xml", source=STRANGER)
    assert run.code == 0, run.output
    assert await calls_total(lab) == before  # the service never heard of it
    assert lab.media_calls() == []  # nor rtpengine
    assert lab.gateway.process.log.matching(rf"refused INVITE from {STRANGER}: not a trunk")


async def test_without_credentials_a_caller_is_challenged_and_nothing_is_set_up(
    lab: SipLab, digest_gateway: Gateway
) -> None:
    before = await calls_total(lab)
    run = await lab.sipp_run(
        "digest_challenged.xml", source=STRANGER, port=DIGEST_PORT, gateway=digest_gateway
    )
    assert run.code == 0, run.output
    assert await calls_total(lab) == before
    assert lab.media_calls(digest_gateway) == []


async def test_wrong_credentials_are_refused(lab: SipLab, digest_gateway: Gateway) -> None:
    before = await calls_total(lab)
    for user, password in (("pbx", "not-the-password"), ("nobody", PASSWORD)):
        run = await lab.sipp_run(
            "digest_refused.xml",
            "-au",
            user,
            "-ap",
            password,
            source=STRANGER,
            port=DIGEST_PORT,
            gateway=digest_gateway,
        )
        assert run.code == 0, f"{user}: {run.output}"
    assert await calls_total(lab) == before
    assert lab.media_calls(digest_gateway) == []
    assert digest_gateway.process.log.matching(r"refused digest user 'pbx'")


async def test_the_right_credentials_get_the_call_answered(
    lab: SipLab, digest_gateway: Gateway
) -> None:
    before = await calls_total(lab)
    run = await lab.sipp_run(
        "digest_call.xml",
        "-au",
        "pbx",
        "-ap",
        PASSWORD,
        "-d",
        "500",
        source=STRANGER,
        port=DIGEST_PORT,
        gateway=digest_gateway,
    )
    assert run.code == 0, run.output
    assert await calls_total(lab) == before + 1
    assert digest_gateway.process.log.matching(r"call .* from trunk pbx answered")
    await lab.wait_until_idle(gateway=digest_gateway)
    assert lab.media_calls(digest_gateway) == []

    # A PBX that registers its trunk is told yes, after the same challenge.
    run = await lab.sipp_run(
        "register_digest.xml",
        "-au",
        "pbx",
        "-ap",
        PASSWORD,
        source=STRANGER,
        port=DIGEST_PORT,
        gateway=digest_gateway,
    )
    assert run.code == 0, run.output


def invite_text(
    source: str, uri: str, call_id: str, cseq: int, extra: str = "", audio_port: str = "40000"
) -> bytes:
    sdp = (
        f"v=0\r\no=- 1 1 IN IP4 {source}\r\ns=-\r\nc=IN IP4 {source}\r\nt=0 0\r\n"
        f"m=audio {audio_port} RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n"
    )
    return (
        f"INVITE {uri} SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP {source}:5096;branch=z9hG4bK{uuid.uuid4().hex}\r\n"
        f"From: <sip:pbx@{source}>;tag={uuid.uuid4().hex[:8]}\r\nTo: <{uri}>\r\n"
        f"Call-ID: {call_id}\r\nCSeq: {cseq} INVITE\r\nContact: <sip:pbx@{source}:5096>\r\n"
        f"Max-Forwards: 70\r\n{extra}Content-Type: application/sdp\r\n"
        f"Content-Length: {len(sdp)}\r\n\r\n{sdp}"
    ).encode()


async def final_reply(lab: SipLab, source: str, request: bytes, port: int) -> str:
    """Send one request from ``source`` (a UDP socket in the lab's namespace): its
    final reply (the 1xx before it skipped)."""
    sock = lab.namespace.new_socket(socket.SOCK_DGRAM)

    def exchange() -> str:
        with sock:
            sock.bind((source, 5096))
            sock.settimeout(5)
            sock.sendto(request, (GATEWAY, port))
            while (reply := sock.recv(65535).decode()).startswith("SIP/2.0 1"):
                pass
            return reply

    return await asyncio.to_thread(exchange)


def digest_param(challenge: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]+)"', challenge)
    assert found is not None, challenge
    return found.group(1)


async def test_a_digest_answer_replayed_from_another_address_is_challenged_again(
    lab: SipLab, digest_gateway: Gateway
) -> None:
    """What an eavesdropper on the trunk's signalling could try: the trunk's
    answer to a challenge, sent again from an address of its own."""
    before = await calls_total(lab)
    uri, call_id = f"sip:{NUMBER}@{GATEWAY}:{DIGEST_PORT}", f"{uuid.uuid4().hex}@{STRANGER}"
    invite = invite_text(STRANGER, uri, call_id, 1)
    challenge = await final_reply(lab, STRANGER, invite, DIGEST_PORT)
    assert challenge.startswith("SIP/2.0 407"), challenge
    realm, nonce = digest_param(challenge, "realm"), digest_param(challenge, "nonce")
    # The right answer (RFC 2617, qop=auth), as the trunk itself would give it.
    ha1 = hashlib.md5(f"pbx:{realm}:{PASSWORD}".encode()).hexdigest()
    ha2 = hashlib.md5(f"INVITE:{uri}".encode()).hexdigest()
    response = hashlib.md5(f"{ha1}:{nonce}:00000001:c0ffee:auth:{ha2}".encode()).hexdigest()
    answer = (
        f'Proxy-Authorization: Digest username="pbx", realm="{realm}", nonce="{nonce}", '
        f'uri="{uri}", response="{response}", algorithm=MD5, qop=auth, nc=00000001, '
        'cnonce="c0ffee"\r\n'
    )
    replayed = await final_reply(
        lab, TRUNK_C, invite_text(TRUNK_C, uri, call_id, 2, answer), DIGEST_PORT
    )
    # Challenged again (a wrong password would get 403): the nonce is good
    # only from the address it was given to.
    assert replayed.startswith("SIP/2.0 407"), replayed
    assert await calls_total(lab) == before


async def test_a_flood_is_dropped_for_a_while_as_another_trunk_calls(lab: SipLab) -> None:
    before = await calls_total(lab)
    flood = asyncio.create_task(
        lab.sipp_run(
            "flood.xml", "-r", "200", "-nr", source=FLOODER, local_port=5090, calls=FLOOD_CALLS
        )
    )
    try:
        await asyncio.sleep(0.7)  # into the flood
        call = await lab.sipp_run("call.xml", "-d", "500", source=TRUNK_B)
    finally:
        flooded = await flood
    assert call.code == 0, call.output
    assert await calls_total(lab) == before + 1

    # Most of the flood had no answer at all (each call of it: one INVITE,
    # answered 403 or not at all).
    assert flooded.successful + flooded.failed == FLOOD_CALLS, flooded.output
    assert flooded.successful <= FLOOD_ANSWERED_AT_MOST, flooded.output
    assert lab.gateway.process.log.matching(rf"flood from {FLOODER}")

    # Dropped for a while after the burst, not just during it: quiet for
    # over 3 s now (the flood's last INVITEs waited 2 s for an answer), so
    # pike has let it go, but the ban holds ...
    await asyncio.sleep(1.5)
    again = await lab.sipp_run("flood.xml", source=FLOODER, local_port=5090)
    assert again.successful == 0, again.output
    # ... until it has been quiet for SIP_FLOOD_BLOCK_S.
    async with asyncio.timeout(BLOCK_S + 10):
        while True:
            retry = await lab.sipp_run("flood.xml", source=FLOODER, local_port=5090)
            if retry.successful:
                break
            await asyncio.sleep(1)
    await lab.wait_until_idle()


async def test_a_trunk_at_its_limit_gets_503_while_another_trunk_is_answered(
    lab: SipLab,
) -> None:
    before = await calls_total(lab)
    # Trunk A (limit 1) holds a call ...
    held = asyncio.create_task(lab.sipp_run("call.xml", "-d", "6000", source=PHONE))
    try:
        async with asyncio.timeout(10):
            while (await lab.stats())["calls"] < 1:  # noqa: ASYNC110 (another process's state)
                await asyncio.sleep(0.1)
        # ... so its second gets 503 with Retry-After, from the gateway,
        # before rtpengine or the service is asked ...
        busy = await lab.sipp_run("trunk_busy_503.xml", source=PHONE, local_port=5081)
        # ... while trunk B's call takes the service's other slot (of two).
        other = await lab.sipp_run("call.xml", "-d", "500", source=TRUNK_B)
    finally:
        held_run = await held
    # (Without the trunk limit both fail: A's second call is answered, and
    # B gets the service's own 503, the service being full.)
    assert (busy.code, other.code) == (0, 0), f"{busy.output}\n{other.output}"
    assert held_run.code == 0, held_run.output
    assert await calls_total(lab) == before + 2
    assert lab.gateway.process.log.matching(r"trunk trunk-a is at its limit of 1 calls")
    await lab.wait_until_idle()

    # The ended call gave its slot back: trunk A may call again.
    again = await lab.sipp_run("call.xml", "-d", "200", source=PHONE)
    assert again.code == 0, again.output
    await lab.wait_until_idle()


async def test_a_trunk_over_its_calls_a_minute_gets_503_while_another_is_answered(
    lab: SipLab,
) -> None:
    before = await calls_total(lab)
    for _ in range(2):  # trunk C's two calls a minute, one after the other
        run = await lab.sipp_run("call.xml", "-d", "200", source=TRUNK_C)
        assert run.code == 0, run.output
    # A third within the minute: 503 with Retry-After, though no call is up.
    busy = await lab.sipp_run("trunk_busy_503.xml", source=TRUNK_C)
    other = await lab.sipp_run("call.xml", "-d", "200", source=TRUNK_B)
    assert busy.code == 0, busy.output
    assert other.code == 0, other.output
    assert await calls_total(lab) == before + 3
    assert lab.gateway.process.log.matching(r"trunk trunk-c is at its limit of 2 calls a minute")
    await lab.wait_until_idle()


def test_the_settings_are_checked_before_the_gateway_starts(tmp_path: Path) -> None:
    """A typo in the access settings stops the start instead of opening the gate."""
    check = GATEWAY_SCRIPT.parent / "access.py"
    users = tmp_path / "users"
    users.write_text("# nobody yet\n")
    for env, error in (
        ({"SIP_ALLOWED_SOURCES": "10.0.0.300"}, "is no address or network"),
        ({"SIP_AUTH_FILE": str(users)}, "lists no username:password"),
        ({"SIP_AUTH_FILE": str(tmp_path / "absent")}, "No such file"),
        (
            {"SIP_ALLOWED_SOURCES": "a=10.0.0.1", "SIP_MAX_CALLS_PER_TRUNK": "b=3"},
            "names no configured trunk",
        ),
        ({"SIP_CALLS_PER_MINUTE_PER_TRUNK": "-1"}, "is no count"),
        ({"SIP_FLOOD_REQUESTS": "lots"}, "is no whole number"),
    ):
        done = subprocess.run(
            [sys.executable, str(check)], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 2 and error in done.stderr, (env, done.stderr)
    opened = subprocess.run(
        [sys.executable, str(check)], env={}, capture_output=True, text=True, check=False
    )
    assert opened.returncode == 0 and "OPEN TO ANYONE" in opened.stderr


async def test_an_invite_the_gateway_cannot_read_leaves_nothing_set_up(lab: SipLab) -> None:
    """What rtpengine and Kamailio take but Python cannot read: a port with
    a letter after it (rtpengine reads "40000x" as 40000), a Contact with a
    byte that is not UTF-8. Read only once the service had made the call,
    each left that call (and its media) up for the call's whole length, its
    trunk slot given back: one trunk could fill the service."""
    before = await calls_total(lab)
    uri = f"sip:{NUMBER}@{GATEWAY}:5060"
    bad_port = invite_text(PHONE, uri, f"{uuid.uuid4().hex}@{PHONE}", 1, audio_port="40000x")
    bad_contact = invite_text(TRUNK_B, uri, f"{uuid.uuid4().hex}@{TRUNK_B}", 1).replace(
        b"Contact: <sip:pbx@", b'Contact: "\xff" <sip:pbx@'
    )
    for source, invite in ((PHONE, bad_port), (TRUNK_B, bad_contact)):
        reply = await final_reply(lab, source, invite, 5060)
        assert reply.startswith("SIP/2.0 400"), reply
    assert await calls_total(lab) == before  # the service never made a call
    assert lab.media_calls() == []  # nor did rtpengine keep one


def rtp_packet(ssrc: int, sequence: int, payload: bytes) -> bytes:
    header = struct.pack("!BBHII", 0x80, 0, sequence & 0xFFFF, (sequence * 160) & 0xFFFFFFFF, ssrc)
    return header + payload


def pcmu_frames(samples: np.ndarray) -> list[bytes]:
    """16 kHz speech as 20 ms PCMU payloads."""
    wide = StreamResampler(16_000, 48_000).process(samples.astype(np.int16))
    encoder = encoder_for("audio/PCMU")
    return [encoder.encode(wide[i : i + 960]) for i in range(0, len(wide) - 959, 960)]


def in_dialog(invite: bytes, answer: str, method: str, cseq: int) -> bytes:
    """``method`` within the call ``invite`` set up and ``answer`` answered."""
    lines = invite.decode().split("\r\n")
    header = {line.split(":", 1)[0]: line for line in lines[1:] if ":" in line}
    to = next(line for line in answer.split("\r\n") if line.lower().startswith("to:"))
    via = header["Via"].split(";branch=")[0] + f";branch=z9hG4bK{uuid.uuid4().hex}"
    return (
        f"{method} {lines[0].split()[1]} SIP/2.0\r\n{via}\r\n{header['From']}\r\n{to}\r\n"
        f"{header['Call-ID']}\r\nCSeq: {cseq} {method}\r\nMax-Forwards: 70\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


async def test_audio_from_an_address_not_the_callers_is_not_heard(lab: SipLab) -> None:
    """Anyone who reaches the relay's ports could speak into another
    person's call: rtpengine forwarded media from any source. A stranger (no
    trunk, no SIP) speaks to a live call's relay port while the caller is
    silent; then the caller speaks. The agent hears the caller alone."""
    requests_before = len(lab.llm.requests)
    uri = f"sip:{NUMBER}@{GATEWAY}:5060"
    invite = invite_text(PHONE, uri, f"{uuid.uuid4().hex}@{PHONE}", 1)
    answer = await final_reply(lab, PHONE, invite, 5060)
    assert answer.startswith("SIP/2.0 200"), answer
    signalling = lab.namespace.new_socket(socket.SOCK_DGRAM)
    signalling.bind((PHONE, 5096))
    signalling.sendto(in_dialog(invite, answer, "ACK", 1), (GATEWAY, 5060))
    relay_port = int(re.search(r"^m=audio (\d+)", answer, re.M).group(1))  # type: ignore[union-attr]
    phone, stranger = (lab.namespace.new_socket(socket.SOCK_DGRAM) for _ in range(2))
    phone.bind((PHONE, 40000))
    stranger.bind((STRANGER, 45000))
    for sock in (phone, stranger):
        sock.setblocking(False)
    loop = asyncio.get_running_loop()
    intruder, caller = pcmu_frames(librivox("0880")), pcmu_frames(librivox("0930"))
    silence = b"\xff" * 160
    # 20 ms packets: the caller's silence with the stranger's sentence over
    # it from 1 s in, then the caller's own sentence, then quiet.
    phone_payloads = [silence] * (50 + len(intruder) + 25) + caller + [silence] * 75
    try:
        for index, payload in enumerate(phone_payloads):
            await loop.sock_sendto(phone, rtp_packet(0x1111, index, payload), (GATEWAY, relay_port))
            if 50 <= index < 50 + len(intruder):
                packet = rtp_packet(0x2222, 7000 + index, intruder[index - 50])
                await loop.sock_sendto(stranger, packet, (GATEWAY, relay_port))
            await asyncio.sleep(0.02)
        async with asyncio.timeout(30):  # the caller's turn reaches the LLM
            while len(lab.llm.requests) == requests_before:  # noqa: ASYNC110 (another process)
                await asyncio.sleep(0.1)
    finally:
        phone.close()
        stranger.close()
        with signalling:
            signalling.sendto(in_dialog(invite, answer, "BYE", 2), (GATEWAY, 5060))
    heard = [
        m["content"]
        for _, body in lab.llm.requests[requests_before:]
        for m in body.get("messages", [])
        if m.get("role") == "user"
    ]
    # The caller's sentence, and nothing of the stranger's ("he was not an
    # ill disposed young man": it was heard as "He was not, and he almost
    # broke" when rtpengine forwarded it).
    assert any(heard_as_its_own("0930", text, ["0930", "0880"]) for text in heard), heard
    intruding = {"not", "ill", "disposed", "young", "man"}
    assert not any(intruding & set(re.findall(r"[a-z]+", text.lower())) for text in heard), heard
    await lab.wait_until_idle()
