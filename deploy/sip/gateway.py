"""The SIP side of the gateway: Kamailio's routes, in Python (KEMI).

Kamailio ends each call's SIP dialog here (it answers, it is no proxy); the
media goes through rtpengine, which turns the phone's plain RTP/AVP into the
ICE + DTLS-SRTP the service speaks. Per call:

INVITE   rtpengine ``offer`` (phone SDP -> WebRTC SDP), POST it to the
         service's ``/v1/realtime/calls``, rtpengine ``answer`` (service SDP ->
         RTP/AVP), 200 OK to the phone. The service's Location is kept:
         it names the call for the DELETE (Kamailio's http_client cannot
         read response headers, so the HTTP legs are Python's own).
BYE      DELETE the service call, rtpengine ``delete``.
CANCEL   487 to the INVITE; a service call made meanwhile is deleted.
others   re-INVITE, UPDATE, INFO, OPTIONS within the call (hold, refreshes,
         key presses): dialogs.py.
hang-up  a timer asks the service once a second whether each call still
         lives; when it does not (the agent hung up, a DTMF hang-up digit,
         the duration limit), the phone gets a BYE. So does a call whose
         session timer (RFC 4028) ran out unrefreshed, and the service call
         is deleted.

Before any of that, every request passes the gateway's defences, cheapest
first, so that what an attacker can make it do costs little: floods
dropped, only trunks let in, each trunk held to its limits (defences.py).
The calls live in a table all of Kamailio's processes share (call_table.py).

Settings come from the environment (see run-gateway and access.py).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dialogs
import KSR  # type: ignore[import-not-found]  # Kamailio's module, there only inside Kamailio
import ng
from call_table import CALLS, CallTable
from defences import ACCESS, TRUNK_RETRY_AFTER_S, Defences, header_value, log
from service_http import CALLS_PATH, SIP_FOR_HTTP, http_request

NG_HOST, _, NG_PORT = os.environ.get("RTPENGINE_NG", "127.0.0.1:2223").rpartition(":")
NG_ADDRESS = (NG_HOST, int(NG_PORT))
CONTACT = os.environ.get("GATEWAY_CONTACT", "sip:agent@127.0.0.1:5060")
# The shortest session interval (RFC 4028's Min-SE) accepted, in seconds.
MIN_SE = int(os.environ.get("SIP_MIN_SE") or dialogs.DEFAULT_MIN_SE)

CANCELLED = "cancelled"  # htable: Call-ID -> 1 once the caller has cancelled

# The service's side of rtpengine: what a browser would offer. strict-source
# on both: once rtpengine has learnt where a side's media comes from, media
# from anywhere else is dropped. Without it, anyone who reaches the relay's
# ports could speak into a call (the agent took it for the caller's words).
OFFER_FLAGS = {
    "transport-protocol": "UDP/TLS/RTP/SAVPF",
    "ICE": "force",
    "rtcp-mux": ["offer"],
    "flags": ["generate-mid", "SDES-off", "strict-source"],
    "replace": ["origin", "session-connection"],
}
ANSWER_FLAGS = {"flags": ["strict-source"], "replace": ["origin", "session-connection"]}


def mod_init() -> Gateway:
    return Gateway()


def uri_of(name_addr: str) -> str:
    """The URI in a Contact or Route value: ``"Ann" <sip:a@b>;x=y`` -> ``sip:a@b``."""
    text = name_addr.strip()
    if "<" in text:
        return text.split("<", 1)[1].split(">", 1)[0]
    return text.split(";", 1)[0]


class Gateway(Defences, CallTable):
    def __init__(self) -> None:
        self.dialogs = dialogs.InDialog(self, CONTACT, MIN_SE)

    service = staticmethod(http_request)  # for dialogs.py

    def child_init(self, rank: int) -> int:
        return 0

    # -- requests ------------------------------------------------------------
    def ksr_request_route(self, msg: object) -> int:
        if self.flooding():
            return 1  # dropped: no answer, so a flood costs nothing more and learns nothing
        method = KSR.pv.get("$rm")
        if method == "ACK":
            KSR.tm.t_check_trans()  # absorbs the ACK of a refusal; a 2xx's ends here
        elif method == "CANCEL":
            self.cancel()
        elif KSR.siputils.has_totag() > 0:
            self.in_dialog(method)
        elif method == "INVITE":
            if self.retransmission():
                return 1
            trunk = self.trunk_of_request(method)
            if trunk is None:
                return 1
            try:
                self.invite(trunk)
            except Exception as exc:  # a bug here must not leave the caller ringing
                log("err", f"INVITE failed: {exc!r}")
                KSR.tm.t_reply(500, "Server Internal Error")
        elif self.trunk_of_request(method) is None:
            return 1
        elif method == "OPTIONS":
            KSR.hdr.append_to_reply(dialogs.CAPABILITIES)
            KSR.sl.sl_send_reply(200, "OK")
        elif method == "REGISTER":
            self.register()
        elif method in ("BYE", "UPDATE", "INFO", "PRACK"):
            KSR.sl.sl_send_reply(481, "Call/Transaction Does Not Exist")  # no To tag: no call
        else:
            KSR.sl.sl_send_reply(501, "Not Implemented")
        return 1

    def ksr_reply_route(self, msg: object) -> int:
        """Replies (to the BYEs this side sends) go on to tm as they are."""
        return 1

    # -- calls ------------------------------------------------------------------
    def invite(self, trunk: str) -> None:
        if not self.take_slot(trunk):
            log("info", f"trunk {trunk} is at its limit of {ACCESS.limit_of(trunk)} calls")
            self.trunk_busy(TRUNK_RETRY_AFTER_S, "too many calls on this trunk")
            return
        if wait_s := self.take_token(trunk):
            # Only calls let in count against the rate: the slot goes back.
            self.free_slot(trunk)
            log("info", f"trunk {trunk} is at its limit of {ACCESS.rate_of(trunk)} calls a minute")
            self.trunk_busy(math.ceil(wait_s), "too many new calls on this trunk")
            return
        answered = False
        try:
            answered = self.set_up(trunk)
        finally:
            if not answered:  # every way out but an answered call gives the slot back
                self.free_slot(trunk)

    def set_up(self, trunk: str) -> bool:
        """The call, from the phone's offer to 200 OK: True once answered."""
        if KSR.tm.t_newtran() < 0:
            KSR.sl.sl_reply_error()
            return False
        call_id, from_tag = KSR.pv.get("$ci"), KSR.pv.get("$ft")
        try:
            body = KSR.pv.get("$rb") or ""
        except ValueError:  # not UTF-8 (UnicodeDecodeError)
            KSR.tm.t_reply(400, "Bad Request")
            return False
        if "m=audio" not in body:
            # A late offer (no SDP) would need the service to offer: not supported.
            KSR.tm.t_reply(488, "Not Acceptable Here (an SDP offer is required)")
            return False
        if (timer := self.dialogs.session_timer()) is None:
            return False  # refused: 420 or 422, before anything is set up
        try:
            # All the call needs from the request, read before anything is
            # set up for it: bytes that are not UTF-8, or an SDP rtpengine
            # takes and Python cannot read ("m=audio 40000x"), are refused
            # here, not after the service made a call nothing would end.
            phone = {
                "from": KSR.pv.get("$tu"),
                "to": KSR.pv.get("$fu"),
                "target": KSR.pv.get("$ct") or "",
                "routes": self.record_routes(),
                "media": dialogs.media_target(body),
                "source": KSR.pv.get("$si"),
                "caller_id": header_value(KSR.pv.get("$fU") or ""),
                "called": header_value(KSR.pv.get("$rU") or ""),
            }
        except ValueError as exc:  # UnicodeDecodeError is one
            log("info", f"INVITE {call_id} refused: {exc!r}")
            KSR.tm.t_reply(400, "Bad Request")
            return False
        KSR.tm.t_reply(100, "Trying")
        try:
            offer = ng.command(
                NG_ADDRESS,
                {"command": "offer", "call-id": call_id, "from-tag": from_tag, "sdp": body}
                | OFFER_FLAGS,
            )["sdp"]
        except (OSError, ng.NgError, KeyError) as exc:
            log("err", f"rtpengine offer failed for {call_id}: {exc}")
            KSR.tm.t_reply(500, "Media Relay Unavailable")
            return False
        try:
            status, headers, answer = http_request(
                "POST",
                CALLS_PATH,
                offer,
                {
                    "Content-Type": "application/sdp",
                    # Whatever the far end put in From and the Request-URI:
                    # the service treats both as untrusted.
                    "X-Caller-Id": phone["caller_id"],
                    "X-Called-Number": phone["called"],
                },
            )
        except (OSError, http.client.HTTPException) as exc:
            log("err", f"the service is unreachable for {call_id}: {exc}")
            self.forget_media(call_id, from_tag)
            KSR.tm.t_reply(503, "Service Unavailable")
            return False
        location = headers.get("Location", "")
        if status != 201 or not location:
            log("warn", f"the service refused {call_id}: {status} {answer[:200]}")
            self.forget_media(call_id, from_tag)
            code, reason = SIP_FOR_HTTP.get(status, (500, "Server Internal Error"))
            if code == 503 and (retry_after := headers.get("Retry-After", "")).isdigit():
                KSR.hdr.append_to_reply(f"Retry-After: {retry_after}\r\n")
            KSR.tm.t_reply(code, reason)
            return False
        try:
            return self.answer_call(trunk, call_id, from_tag, location, answer, phone, timer)
        except BaseException:
            # The service made the call: whatever failed, nothing else would end it.
            self.end_service_call(location)
            self.forget_media(call_id, from_tag)
            raise

    def answer_call(
        self,
        trunk: str,
        call_id: str,
        from_tag: str,
        location: str,
        answer: str,
        phone: dict[str, Any],
        timer: dialogs.Timer,
    ) -> bool:
        """The phone answered with the service's call (``location``): True
        once answered; on False, the service call and the media are ended."""
        if KSR.htable.sht_get(CANCELLED, call_id) is not None:
            self.end_service_call(location)
            self.forget_media(call_id, from_tag)
            KSR.tm.t_reply(487, "Request Terminated")
            return False
        to_tag = KSR.pv.get("$ltt(t)")  # the To tag of tm's local replies
        try:
            phone_answer = ng.command(
                NG_ADDRESS,
                {
                    "command": "answer",
                    "call-id": call_id,
                    "from-tag": from_tag,
                    "to-tag": to_tag,
                    "sdp": answer,
                }
                | ANSWER_FLAGS,
            )["sdp"]
        except (OSError, ng.NgError, KeyError) as exc:
            log("err", f"rtpengine answer failed for {call_id}: {exc}")
            self.end_service_call(location)
            self.forget_media(call_id, from_tag)
            KSR.tm.t_reply(500, "Media Relay Unavailable")
            return False
        call = {
            "location": location,
            "from_tag": from_tag,
            "to_tag": to_tag,
            # This side's BYE: From and To swap, to the phone's Contact, along
            # the route the INVITE recorded.
            "from": phone["from"],
            "to": phone["to"],
            "target": phone["target"],
            "routes": phone["routes"],
            # The phone side's SDP: the answer as rtpengine made it, the one
            # last sent (dialogs.py: hold, formats, versions), the call's
            # codec and where the phone's first offer sent the audio.
            "first_answer": dialogs.normalized(phone_answer),
            "answer": dialogs.normalized(phone_answer),
            "codec": "/".join(dialogs.codec_of(phone_answer) or ()),
            "media": phone["media"],
            # For rtpengine when the phone moves its audio: the service's answer.
            "service_answer": answer,
            "held": False,
            # Its session timer: the interval (0: none) and the last refresh.
            "timer": timer.interval,
            "refreshed": time.monotonic(),
            # Whose slot the call holds, and where its in-dialog requests may
            # come from besides the trunk's listed addresses.
            "trunk": trunk,
            "source": phone["source"],
        }
        KSR.htable.sht_sets(CALLS, call_id, json.dumps(call))
        KSR.hdr.append_to_reply(f"Contact: <{CONTACT}>\r\n{dialogs.CAPABILITIES}{timer.headers()}")
        KSR.textops.set_reply_body(call["answer"], "application/sdp")
        KSR.tm.t_reply(200, "OK")
        log("info", f"call {call_id} from trunk {trunk} answered, service call {location}")
        return True

    def in_dialog(self, method: str) -> None:
        """A request within a call: it must name the call exactly (Call-ID and
        both tags) and come from the call's own source or one of the listed
        trunk addresses (a carrier may send its BYE from another of them)."""
        call_id = KSR.pv.get("$ci")
        call = self.lookup(call_id)
        source = KSR.pv.get("$si")
        if (
            not ACCESS.open
            and (call is None or source != call.get("source"))
            and ACCESS.trunk_of_source(source) is None
        ):
            log("info", f"refused in-dialog {method} from {source}: not a trunk")
            KSR.sl.sl_send_reply(403, "Forbidden")
            return
        if call is None or (call["from_tag"], call["to_tag"]) != (
            KSR.pv.get("$ft"),
            KSR.pv.get("$tt"),
        ):
            KSR.sl.sl_send_reply(481, "Call/Transaction Does Not Exist")
        elif method == "BYE":
            self.bye(call_id)
        else:
            self.dialogs.request(method, call_id, call)

    @staticmethod
    def move_media(call_id: str, call: dict[str, Any], offer: str) -> str:
        """The phone's audio moved to another address or port (a re-offer):
        rtpengine is offered it again, with the flags of the call's first
        offer, and answered with the service's own answer again. Its side
        towards the service keeps its ICE credentials, DTLS fingerprint and
        role and its port, so the service sees no change (it is told
        nothing); the phone's side follows the new address (and learns it
        again from the phone's packets). The phone side's SDP comes back
        (raises OSError, ng.NgError, KeyError)."""
        tags = {"call-id": call_id, "from-tag": call["from_tag"]}
        ng.command(NG_ADDRESS, {"command": "offer", "sdp": offer} | tags | OFFER_FLAGS)
        answer = {"command": "answer", "to-tag": call["to_tag"], "sdp": call["service_answer"]}
        return str(ng.command(NG_ADDRESS, answer | tags | ANSWER_FLAGS)["sdp"])

    @staticmethod
    def block_media(call_id: str, call: dict[str, Any], blocked: bool) -> None:
        """rtpengine stops forwarding the service's audio to the phone (the
        phone holds the call: the answer promised it none), or resumes. The
        service's side goes on as it was."""
        command = "block media" if blocked else "unblock media"
        try:  # the service side's packets: its tag is the To tag
            ng.command(
                NG_ADDRESS, {"command": command, "call-id": call_id, "from-tag": call["to_tag"]}
            )
        except (OSError, ng.NgError) as exc:
            log("warn", f"rtpengine {command} for {call_id} failed: {exc}")

    def bye(self, call_id: str) -> None:
        call = self.take_call(call_id)
        if call is None:  # ended by the service meanwhile: its BYE is on the way
            KSR.sl.sl_send_reply(481, "Call/Transaction Does Not Exist")
            return
        KSR.sl.sl_send_reply(200, "OK")
        self.end_service_call(call["location"])
        self.forget_media(call_id, call["from_tag"])
        log("info", f"call {call_id} hung up by the caller")

    def cancel(self) -> None:
        # A CANCEL must match the INVITE's transaction (its Via branch, Call-ID,
        # CSeq and From tag): only the INVITE's sender knows those.
        if KSR.tm.t_check_trans() > 0:
            # The INVITE's worker may be waiting on the service: it reads this
            # flag when the answer comes and gives the caller 487 instead.
            KSR.htable.sht_seti(CANCELLED, KSR.pv.get("$ci"), 1)
            return
        KSR.sl.sl_send_reply(481, "Call/Transaction Does Not Exist")

    @staticmethod
    def register() -> None:
        """A trunk that registers (a PBX keeping its trunk up) is told yes.
        Nothing is stored: the gateway never calls a trunk, it only answers."""
        contact = KSR.pv.get("$ct") or ""
        if contact and contact != "*":
            expires = KSR.pv.get("$hdr(Expires)") or ""
            if "expires=" not in contact.lower():
                contact += f";expires={expires if expires.isdigit() else 3600}"
            KSR.hdr.append_to_reply(f"Contact: {contact}\r\n")
        KSR.sl.sl_send_reply(200, "OK")

    # -- the service hanging up ------------------------------------------------
    def ksr_hangups(self, msg: object, *event: object) -> int:
        """Every second (rtimer): a BYE for each call the service has ended,
        and for each whose session timer ran out (its service call deleted)."""
        ended: list[tuple[str, dict[str, Any]]] = []
        KSR.htable.sht_iterator_start("it", CALLS)
        while KSR.htable.sht_iterator_next("it") > 0:
            call_id = KSR.pv.get("$shtitkey(it)")
            ended.append((call_id, json.loads(KSR.pv.get("$shtitval(it)"))))
        KSR.htable.sht_iterator_end("it")
        for call_id, call in ended:
            if dialogs.expired(call, time.monotonic()):
                # Taken only if still unrefreshed: a refresh may have just come.
                taken = self.take_call(call_id, lambda c: dialogs.expired(c, time.monotonic()))
                if taken is not None:
                    self.send_bye(call_id, taken)
                    self.end_service_call(taken["location"])
                    self.forget_media(call_id, taken["from_tag"])
                    log("info", f"call {call_id} ended: its session timer ran out")
                continue
            try:
                status, _, _ = http_request("GET", call["location"])
            except (OSError, http.client.HTTPException):
                continue  # the service unreachable: ask again next time
            if status != 404 or self.take_call(call_id) is None:
                continue  # alive, or the caller's BYE came first
            self.send_bye(call_id, call)
            self.forget_media(call_id, call["from_tag"])
            log("info", f"call {call_id} hung up by the service")
        return 1

    def send_bye(self, call_id: str, call: dict[str, Any]) -> None:
        routes = list(call["routes"])
        headers = (
            f"From: <{call['from']}>;tag={call['to_tag']}\r\n"
            f"To: <{call['to']}>;tag={call['from_tag']}\r\n"
            f"Call-ID: {call_id}\r\n"
            "CSeq: 1 BYE\r\n"
            f"Contact: <{CONTACT}>\r\n"
        )
        headers += "".join(f"Route: {route}\r\n" for route in routes)
        # A loose route set (;lr) sends the BYE to its first hop.
        nexthop = uri_of(routes[0]) if routes else ""
        KSR.tm.t_uac_send("BYE", uri_of(call["target"]) or call["to"], nexthop, "", headers, "")

    # -- the service and rtpengine ---------------------------------------------
    @staticmethod
    def end_service_call(location: str) -> None:
        try:
            http_request("DELETE", location)
        except (OSError, http.client.HTTPException) as exc:
            log("warn", f"DELETE {location} failed: {exc}")

    @staticmethod
    def forget_media(call_id: str, from_tag: str) -> None:
        try:
            ng.command(NG_ADDRESS, {"command": "delete", "call-id": call_id, "from-tag": from_tag})
        except (OSError, ng.NgError) as exc:
            log("warn", f"rtpengine delete for {call_id} failed: {exc}")
