"""Requests within an answered call, but BYE (gateway.py): what a trunk
sends in the middle of a call, and what the gateway answers.

re-INVITE, UPDATE (RFC 3311) with SDP
         an offer within the call. The phone-side answer is the one given
         at set-up, with the direction that complements the offer's
         (sendonly -> recvonly, inactive -> inactive, recvonly -> sendonly;
         c=0.0.0.0, RFC 2543's hold, counts as sendonly) and only the
         formats the offer still lists; its o= version goes up whenever it
         changes (RFC 3264 section 8). An offer of sendonly or inactive puts
         the service call on hold (``POST {call}/hold``), a later sendrecv or
         recvonly takes it off; an offer of recvonly or inactive tells the
         service the phone sends nothing (``"sending": false``: no lost
         peer when its audio stops); while the answer says recvonly or inactive,
         rtpengine forwards nothing of the service's to the phone. Audio
         moved to another address or port is offered to rtpengine again
         (gateway.py's ``move_media``: the service's side stays as it is).
         An offer without the call's codec (the first the service answered:
         the one it sends) or with the audio stream refused (port 0) gets
         488 and changes nothing (RFC 3261 section 14.1). Other in-dialog
         requests: PRACK 481 (no reliable provisional answer is ever sent),
         REFER and the like 405 with Allow, unknown methods 501.
UPDATE without SDP, re-INVITE without SDP
         a session refresh: 200 (the re-INVITE's with the current SDP).
Contact  each accepted re-INVITE or UPDATE that carries one refreshes the
         call's remote target (RFC 3261 section 12.2.2): the gateway's BYE
         goes to the phone's latest Contact.
INFO     a key press (application/dtmf-relay: ``Signal=5``; application/dtmf:
         ``5``; 10 and 11 are * and #) goes to the service
         (``POST {call}/dtmf``); without a body (a keep-alive) 200; another
         type 415 with Accept.
OPTIONS  200, with what the gateway allows and accepts.
timers   Session-Expires (RFC 4028) on the INVITE and on each refresh, from a
         UAC that supports timers and refreshes itself: below Min-SE 422
         with Min-SE, else the 2xx carries ``Session-Expires: N;refresher=uac``
         and ``Require: timer``. A call not refreshed in time is ended by the
         gateway (``expired``; gateway.py sends the BYE).

The functions at the top are plain Python (INFO bodies, timers; the SDP's
are in sdp_text.py), tested without Kamailio; ``InDialog`` is Kamailio's
side and needs its KSR module.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from sdp_text import (  # noqa: F401  (also the tests' names, through this module)
    COMPLEMENT,
    DIRECTIONS,
    HELD,
    SENDING,
    STATIC_FORMATS,
    TELEPHONE_EVENT,
    audio_of,
    codec_of,
    connection_of,
    direction_of,
    format_line_of,
    formats_of,
    is_direction,
    joined,
    media_target,
    moved,
    next_answer,
    normalized,
    origin_of,
    restricted_to,
    sections,
    with_direction,
    with_next_version,
    with_origin,
)

try:
    import KSR  # type: ignore[import-not-found]  # Kamailio's module, there only inside Kamailio
except ImportError:  # the tests: the plain functions only
    KSR = None

DEFAULT_MIN_SE = 90  # seconds; RFC 4028's floor for Min-SE
KEYS = "0123456789*#ABCD"  # RFC 4733 events 0-15: 10 is *, 11 is #
INFO_TYPES = ("application/dtmf-relay", "application/dtmf")
# What every final answer to a call's requests says the gateway does.
CAPABILITIES = (
    "Allow: INVITE, ACK, BYE, CANCEL, OPTIONS, UPDATE, INFO\r\n"
    "Accept: application/sdp, application/dtmf-relay, application/dtmf\r\n"
    "Supported: timer\r\n"
)
EXTENSIONS = frozenset({"timer"})  # option tags a request may Require


# -- INFO -----------------------------------------------------------------------
class UnsupportedInfo(ValueError):
    """An INFO body of a type the gateway does not read (415)."""


def key_of(text: str) -> str:
    value = text.strip().upper()
    if value.isdigit() and int(value) < len(KEYS):
        return KEYS[int(value)]
    if len(value) == 1 and value in KEYS:
        return value
    raise ValueError(f"no key: {text.strip()[:20]!r}")


def info_key(content_type: str, body: str) -> str:
    """The key an INFO reports ("" for one without a body: a keep-alive).
    UnsupportedInfo for a body of another type, ValueError for a bad one."""
    if not body.strip():
        return ""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == "application/dtmf-relay":
        for line in body.splitlines():
            name, equals, value = line.partition("=")
            if equals and name.strip().lower() == "signal":
                return key_of(value)
        raise ValueError("no Signal= line")
    if kind == "application/dtmf":
        return key_of(body)
    raise UnsupportedInfo(kind or "no Content-Type")


# -- session timers (RFC 4028) --------------------------------------------------
@dataclass(frozen=True)
class Timer:
    """A request's session timer, as agreed: ``interval`` seconds (0: none),
    or ``too_small`` (422)."""

    interval: int = 0
    too_small: bool = False

    def headers(self) -> str:
        """For the 2xx: the interval, the UAC refreshing (it must: Require)."""
        if not self.interval:
            return ""
        return f"Session-Expires: {self.interval};refresher=uac\r\nRequire: timer\r\n"


def option_tags(values: Iterable[str]) -> set[str]:
    """Supported or Require values (one header each, comma lists) as tags."""
    return {tag.strip().lower() for value in values for tag in value.split(",") if tag.strip()}


def negotiate_timer(session_expires: str, supported: set[str], min_se: int) -> Timer:
    """The timer for a request's ``Session-Expires`` (RFC 4028 section 9).

    Only a UAC that supports timers and refreshes itself gets one: one that
    does not support them (a proxy asked for the timer) or asks the gateway
    to refresh (refresher=uas) gets none, the gateway sending no refreshes
    of its own: its 2xx then carries no Session-Expires, which RFC 4028
    reads as no session expiry. A malformed value is ignored the same way."""
    value, *parameters = session_expires.split(";")
    if not value.strip().isdigit() or "timer" not in supported:
        return Timer()
    interval = int(value)
    if interval < min_se:
        return Timer(too_small=True)
    refresher = ""
    for parameter in parameters:
        name, _, given = parameter.partition("=")
        if name.strip().lower() == "refresher":
            refresher = given.strip().lower()
    return Timer() if refresher == "uas" else Timer(interval)


def bye_after(interval: int) -> float:
    """When the side that does not refresh ends an unrefreshed session
    (RFC 4028 section 10): before it expires, by a third of it, at most 32 s."""
    return interval - min(32.0, interval / 3)


def expired(call: dict[str, Any], now: float) -> bool:
    """Whether a call's session timer has run out (``now``: time.monotonic())."""
    interval = int(call.get("timer") or 0)
    return bool(interval) and now - float(call.get("refreshed", now)) >= bye_after(interval)


# -- Kamailio's side ------------------------------------------------------------
class Gateway(Protocol):
    """What the requests within a call need of gateway.py."""

    def service(
        self, method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], str]:
        """One HTTP request to the service (raises OSError)."""

    def replace_call(self, call_id: str, call: dict[str, Any]) -> bool:
        """The call stored again, unless it ended meanwhile (False)."""

    def retransmission(self) -> bool:
        """Whether the request repeats one being handled or answered (absorbed)."""

    def move_media(self, call_id: str, call: dict[str, Any], offer: str) -> str:
        """rtpengine told of the phone's new audio address: the phone side's SDP."""

    def block_media(self, call_id: str, call: dict[str, Any], blocked: bool) -> None:
        """rtpengine stops (or resumes) forwarding the service's audio to the phone."""


def log(level: str, message: str) -> None:
    getattr(KSR, level)(f"voice-agent gateway: {message}\n")


def header_values(name: str) -> list[str]:
    """Every value of a header of the request (each line, in order)."""
    count = KSR.pv.get(f"$hdrc({name})") or 0
    return [KSR.pv.get(f"$(hdr({name})[{i}])") or "" for i in range(count)]


def first_header(*names: str) -> str:
    """The first value of a header, by any of its names (full, compact)."""
    for name in names:
        if value := KSR.pv.get(f"$hdr({name})"):
            return str(value)
    return ""


@dataclass
class InDialog:
    """A call's requests but BYE, for ``gateway``; ``contact``: the gateway's
    Contact; ``min_se``: the shortest session interval accepted, in seconds."""

    gateway: Gateway
    contact: str
    min_se: int = DEFAULT_MIN_SE

    def request(self, method: str, call_id: str, call: dict[str, Any]) -> None:
        if method == "OPTIONS":
            KSR.hdr.append_to_reply(CAPABILITIES)
            KSR.sl.sl_send_reply(200, "OK")
            return
        if method not in ("INVITE", "UPDATE", "INFO"):
            self.refuse(method)
            return
        if self.gateway.retransmission():
            return
        if KSR.tm.t_newtran() < 0:
            KSR.sl.sl_reply_error()
            return
        try:
            if method == "INFO":
                self.info(call_id, call)
            else:
                self.offer(method, call_id, call)
        except Exception as exc:  # a bug here must not leave the request unanswered
            log("err", f"{method} in call {call_id} failed: {exc!r}")
            KSR.tm.t_reply(500, "Server Internal Error")

    @staticmethod
    def refuse(method: str) -> None:
        if method == "PRACK":  # no reliable provisional answer is ever sent
            KSR.sl.sl_send_reply(481, "Call/Transaction Does Not Exist")
        elif method in ("REFER", "NOTIFY", "SUBSCRIBE", "MESSAGE", "PUBLISH", "REGISTER"):
            KSR.hdr.append_to_reply(CAPABILITIES)
            KSR.sl.sl_send_reply(405, "Method Not Allowed")
        else:
            KSR.sl.sl_send_reply(501, "Not Implemented")

    # -- timers --------------------------------------------------------------
    def session_timer(self) -> Timer | None:
        """The request's session timer, or None once it has been refused
        (420 for an extension the gateway lacks, 422 for a short interval)."""
        if unknown := sorted(option_tags(header_values("Require")) - EXTENSIONS):
            KSR.hdr.append_to_reply(f"Unsupported: {', '.join(unknown)}\r\n")
            KSR.tm.t_reply(420, "Bad Extension")
            return None
        supported = option_tags(header_values("Supported") + header_values("k"))
        timer = negotiate_timer(first_header("Session-Expires", "x"), supported, self.min_se)
        if timer.too_small:
            KSR.hdr.append_to_reply(f"Min-SE: {self.min_se}\r\n")
            KSR.tm.t_reply(422, "Session Interval Too Small")
            return None
        return timer

    # -- offers within the call ------------------------------------------------
    def offer(self, method: str, call_id: str, call: dict[str, Any]) -> None:
        """A re-INVITE or an UPDATE: a refresh, with or without a new offer."""
        timer = self.session_timer()
        if timer is None:
            return
        body = KSR.pv.get("$rb") or ""
        answer = None
        if "m=" in body:
            answer = self.answer(call_id, call, body)
            if answer is None:
                return
        elif method == "INVITE":
            # No offer: the 200 offers the current SDP; the ACK's answer is not read.
            answer = call["answer"]
        call.update(
            answer=answer or call["answer"],
            timer=timer.interval,
            refreshed=time.monotonic(),  # one clock for all of Kamailio's processes
            # A target refresh (RFC 3261 section 12.2.2, RFC 3311): the
            # phone's new Contact is where the gateway's BYE goes from now on.
            target=KSR.pv.get("$ct") or call["target"],
        )
        if not self.gateway.replace_call(call_id, call):  # hung up meanwhile
            KSR.tm.t_reply(481, "Call/Transaction Does Not Exist")
            return
        KSR.hdr.append_to_reply(f"Contact: <{self.contact}>\r\n{CAPABILITIES}{timer.headers()}")
        if answer is not None:
            KSR.textops.set_reply_body(answer, "application/sdp")
        KSR.tm.t_reply(200, "OK")

    def answer(self, call_id: str, call: dict[str, Any], offer: str) -> str | None:
        """The answer to an offer within the call, the service told of a hold
        or a resume on the way; None once refused (488, or the service's
        trouble), the call as it was."""
        try:
            target = media_target(offer)
        except ValueError:  # no port rtpengine and this side read alike
            target = None
        if target is None or target[1] == 0:
            KSR.tm.t_reply(488, "Not Acceptable Here (the audio stream is required)")
            return None
        answer = next_answer(call["first_answer"], call["answer"], offer)
        if answer is None:
            log("info", f"call {call_id}: refused an offer without its codec {call['codec']}")
            KSR.tm.t_reply(488, "Not Acceptable Here (the call's codec is required)")
            return None
        now = call.get("media")
        held = direction_of(offer) in HELD
        # rtpengine keeps the address it learnt from the phone's first packet
        # and drops audio from anywhere else (gateway.py, strict-source): it is
        # offered the audio again when the phone moves it, and on a resume,
        # whose packets may come through a NAT mapping the hold let expire.
        resuming = call.get("held", False) and not held
        moving = bool(now) and moved((now[0], int(now[1])), target)
        if now and (moving or resuming):
            try:
                first_answer = normalized(self.gateway.move_media(call_id, call, offer))
            except Exception as exc:
                log("err", f"call {call_id}: moving its audio to {target} failed: {exc!r}")
                KSR.tm.t_reply(500, "Media Relay Unavailable")
                return None
            call.update(first_answer=first_answer, media=target)
            answer = next_answer(first_answer, call["answer"], offer) or answer
            where = f"{target[0]}:{target[1]}"
            log(
                "info",
                f"call {call_id}: its audio {'moved to' if moving else 'learnt again at'} {where}",
            )
        # A phone that offers recvonly or inactive will send nothing: its
        # silence is no lost peer (recvonly is no hold: the agent speaks on).
        sending = direction_of(offer) in SENDING
        if held != call.get("held", False) or sending != call.get("sending", True):
            status = self.post(call, "hold", {"held": held, "sending": sending})
            if status != 200:
                self.reply_for(status)
                return None
            call["sending"] = sending
        # An answer of recvonly or inactive promises the phone no audio (RFC 3264).
        silent = COMPLEMENT[direction_of(offer)] in ("recvonly", "inactive")
        if silent != call.get("silent", False):
            self.gateway.block_media(call_id, call, silent)
            call["silent"] = silent
        if held != call.get("held", False):
            call["held"] = held
            log("info", f"call {call_id} {'held' if held else 'resumed'} by the caller")
        return answer

    # -- key presses -------------------------------------------------------------
    def info(self, call_id: str, call: dict[str, Any]) -> None:
        content_type = KSR.pv.get("$hdr(Content-Type)") or KSR.pv.get("$hdr(c)") or ""
        try:
            key = info_key(content_type, KSR.pv.get("$rb") or "")
        except UnsupportedInfo:
            KSR.hdr.append_to_reply(f"Accept: {', '.join(INFO_TYPES)}\r\n")
            KSR.tm.t_reply(415, "Unsupported Media Type")
            return
        except ValueError as exc:
            log("info", f"call {call_id}: a bad INFO key press: {exc}")
            KSR.tm.t_reply(400, "Bad Request (no key in the body)")
            return
        if key:
            status = self.post(call, "dtmf", {"digits": key})
            if status != 200:
                self.reply_for(status)
                return
        KSR.tm.t_reply(200, "OK")

    # -- the service ---------------------------------------------------------------
    def post(self, call: dict[str, Any], what: str, body: dict[str, Any]) -> int:
        """POST to the call's ``what`` at the service: the status (0: unreachable)."""
        try:
            status, _, text = self.gateway.service(
                "POST",
                f"{call['location']}/{what}",
                json.dumps(body),
                {"Content-Type": "application/json"},
            )
        except OSError as exc:
            log("warn", f"POST {call['location']}/{what} failed: {exc}")
            return 0
        if status != 200:
            log("warn", f"POST {call['location']}/{what}: {status} {text[:200]}")
        return status

    @staticmethod
    def reply_for(status: int) -> None:
        if status == 404:  # the service has ended the call: its BYE is on the way
            KSR.tm.t_reply(481, "Call/Transaction Does Not Exist")
        else:
            KSR.tm.t_reply(500, "Server Internal Error")
