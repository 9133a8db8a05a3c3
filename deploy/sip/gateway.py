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
hang-up  a timer asks the service once a second whether each call still
         lives; when it does not (the agent hung up, a DTMF hang-up digit,
         the duration limit), the phone gets a BYE.

Settings come from the environment (see run-gateway).
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import urllib.parse

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import KSR  # Kamailio's module, there only inside Kamailio
import ng

SERVICE = urllib.parse.urlsplit(os.environ.get("VOICE_AGENT_URL", "http://127.0.0.1:8080"))
API_KEY = os.environ.get("VOICE_AGENT_API_KEY", "")
NG_HOST, _, NG_PORT = os.environ.get("RTPENGINE_NG", "127.0.0.1:2223").rpartition(":")
NG_ADDRESS = (NG_HOST, int(NG_PORT))
CONTACT = os.environ.get("GATEWAY_CONTACT", "sip:agent@127.0.0.1:5060")
HTTP_TIMEOUT_S = float(os.environ.get("VOICE_AGENT_TIMEOUT_S", "15"))
CALLS_PATH = SERVICE.path.rstrip("/") + "/v1/realtime/calls"

CALLS = "calls"  # htable (shared by Kamailio's processes): Call-ID -> the call, as JSON
CANCELLED = "cancelled"  # htable: Call-ID -> 1 once the caller has cancelled

# The service's side of rtpengine: what a browser would offer.
OFFER_FLAGS = {
    "transport-protocol": "UDP/TLS/RTP/SAVPF",
    "ICE": "force",
    "rtcp-mux": ["offer"],
    "flags": ["generate-mid", "SDES-off"],
    "replace": ["origin", "session-connection"],
}
ANSWER_FLAGS = {"replace": ["origin", "session-connection"]}

# The service's refusals, as SIP answers to the caller.
SIP_FOR_HTTP = {
    400: (488, "Not Acceptable Here"),
    401: (403, "Forbidden"),
    403: (403, "Forbidden"),
    413: (488, "Not Acceptable Here"),
    429: (503, "Service Unavailable"),
    503: (503, "Service Unavailable"),
}


def mod_init() -> Gateway:
    return Gateway()


def http_request(
    method: str, path: str, body: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], str]:
    """One request to the service: status, headers, body (raises OSError)."""
    connection_type = (
        http.client.HTTPSConnection if SERVICE.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_type(SERVICE.netloc, timeout=HTTP_TIMEOUT_S)
    try:
        sent = dict(headers or {})
        if API_KEY:
            sent["Authorization"] = f"Bearer {API_KEY}"
        connection.request(method, path, body=body.encode() if body else None, headers=sent)
        response = connection.getresponse()
        return (
            response.status,
            dict(response.getheaders()),
            response.read().decode(errors="replace"),
        )
    finally:
        connection.close()


def header_value(text: str) -> str:
    """A caller-supplied value made safe for one HTTP header line."""
    return "".join(ch for ch in text if ch.isprintable())[:128]


def uri_of(name_addr: str) -> str:
    """The URI in a Contact or Route value: ``"Ann" <sip:a@b>;x=y`` -> ``sip:a@b``."""
    text = name_addr.strip()
    if "<" in text:
        return text.split("<", 1)[1].split(">", 1)[0]
    return text.split(";", 1)[0]


def log(level: str, message: str) -> None:
    getattr(KSR, level)(f"voice-agent gateway: {message}\n")


class Gateway:
    def child_init(self, rank: int) -> int:
        return 0

    # -- requests ------------------------------------------------------------
    def ksr_request_route(self, msg: object) -> int:
        method = KSR.pv.get("$rm")
        in_dialog = KSR.siputils.has_totag() > 0
        if method == "OPTIONS":
            KSR.sl.sl_send_reply(200, "OK")
        elif method == "CANCEL":
            self.cancel()
        elif method == "ACK":
            KSR.tm.t_check_trans()  # absorbs the ACK of a refusal; a 2xx's ends here
        elif method == "INVITE" and not in_dialog:
            try:
                self.invite()
            except Exception as exc:  # a bug here must not leave the caller ringing
                log("err", f"INVITE failed: {exc!r}")
                KSR.tm.t_reply(500, "Server Internal Error")
        elif method == "INVITE":
            self.reinvite()
        elif method == "BYE":
            self.bye()
        else:
            KSR.sl.sl_send_reply(501, "Not Implemented")
        return 1

    def ksr_reply_route(self, msg: object) -> int:
        """Replies (to the BYEs this side sends) go on to tm as they are."""
        return 1

    def invite(self) -> None:
        # A retransmission (the phone not yet told 100 Trying) is absorbed
        # by the transaction it repeats, never a second service call.
        if KSR.tmx.t_precheck_trans() > 0:
            KSR.tm.t_check_trans()
            return
        if KSR.tm.t_check_trans() == 0:
            return
        if KSR.tm.t_newtran() < 0:
            KSR.sl.sl_reply_error()
            return
        call_id, from_tag = KSR.pv.get("$ci"), KSR.pv.get("$ft")
        body = KSR.pv.get("$rb") or ""
        if "m=audio" not in body:
            # A late offer (no SDP) would need the service to offer: not supported.
            KSR.tm.t_reply(488, "Not Acceptable Here (an SDP offer is required)")
            return
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
            return
        try:
            status, headers, answer = http_request(
                "POST",
                CALLS_PATH,
                offer,
                {
                    "Content-Type": "application/sdp",
                    # Whatever the far end put in From and the Request-URI:
                    # the service treats both as untrusted.
                    "X-Caller-Id": header_value(KSR.pv.get("$fU") or ""),
                    "X-Called-Number": header_value(KSR.pv.get("$rU") or ""),
                },
            )
        except OSError as exc:
            log("err", f"the service is unreachable for {call_id}: {exc}")
            self.forget_media(call_id, from_tag)
            KSR.tm.t_reply(503, "Service Unavailable")
            return
        location = headers.get("Location", "")
        if status != 201 or not location:
            log("warn", f"the service refused {call_id}: {status} {answer[:200]}")
            self.forget_media(call_id, from_tag)
            code, reason = SIP_FOR_HTTP.get(status, (500, "Server Internal Error"))
            KSR.tm.t_reply(code, reason)
            return
        if KSR.pv.get(f"$sht({CANCELLED}=>{call_id})"):
            self.end_service_call(location)
            self.forget_media(call_id, from_tag)
            KSR.tm.t_reply(487, "Request Terminated")
            return
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
            return
        call = {
            "location": location,
            "from_tag": from_tag,
            "to_tag": to_tag,
            # This side's BYE: From and To swap, to the phone's Contact, along
            # the route the INVITE recorded.
            "from": KSR.pv.get("$tu"),
            "to": KSR.pv.get("$fu"),
            "target": KSR.pv.get("$ct") or "",
            "routes": self.record_routes(),
            "answer": phone_answer,
        }
        KSR.htable.sht_sets(CALLS, call_id, json.dumps(call))
        KSR.hdr.append_to_reply(f"Contact: <{CONTACT}>\r\n")
        KSR.textops.set_reply_body(phone_answer, "application/sdp")
        KSR.tm.t_reply(200, "OK")
        log("info", f"call {call_id} answered, service call {location}")

    def reinvite(self) -> None:
        """A session refresh keeps the media as it is (no hold, no codec change)."""
        call = self.lookup(KSR.pv.get("$ci"))
        if KSR.tm.t_newtran() < 0:
            KSR.sl.sl_reply_error()
            return
        if call is None:
            KSR.tm.t_reply(481, "Call/Transaction Does Not Exist")
            return
        KSR.hdr.append_to_reply(f"Contact: <{CONTACT}>\r\n")
        KSR.textops.set_reply_body(call["answer"], "application/sdp")
        KSR.tm.t_reply(200, "OK")

    def bye(self) -> None:
        call_id = KSR.pv.get("$ci")
        call = self.lookup(call_id)
        if call is None:
            KSR.sl.sl_send_reply(481, "Call/Transaction Does Not Exist")
            return
        KSR.sl.sl_send_reply(200, "OK")
        KSR.htable.sht_rm(CALLS, call_id)
        self.end_service_call(call["location"])
        self.forget_media(call_id, call["from_tag"])
        log("info", f"call {call_id} hung up by the caller")

    def cancel(self) -> None:
        if KSR.tm.t_check_trans() > 0:
            # The INVITE's worker may be waiting on the service: it reads this
            # flag when the answer comes and gives the caller 487 instead.
            KSR.htable.sht_seti(CANCELLED, KSR.pv.get("$ci"), 1)
            return
        KSR.sl.sl_send_reply(481, "Call/Transaction Does Not Exist")

    # -- the service hanging up ------------------------------------------------
    def ksr_hangups(self, msg: object, *event: object) -> int:
        """Every second (rtimer): a BYE for each call the service has ended."""
        ended: list[tuple[str, dict[str, str]]] = []
        KSR.htable.sht_iterator_start("it", CALLS)
        while KSR.htable.sht_iterator_next("it") > 0:
            call_id = KSR.pv.get("$shtitkey(it)")
            ended.append((call_id, json.loads(KSR.pv.get("$shtitval(it)"))))
        KSR.htable.sht_iterator_end("it")
        for call_id, call in ended:
            try:
                status, _, _ = http_request("GET", call["location"])
            except OSError:
                continue  # the service unreachable: ask again next time
            if status != 404:
                continue
            KSR.htable.sht_rm(CALLS, call_id)
            self.send_bye(call_id, call)
            self.forget_media(call_id, call["from_tag"])
            log("info", f"call {call_id} hung up by the service")
        return 1

    def send_bye(self, call_id: str, call: dict[str, str]) -> None:
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

    # -- helpers --------------------------------------------------------------
    @staticmethod
    def record_routes() -> list[str]:
        """The INVITE's Record-Route entries: the route set for our requests."""
        routes: list[str] = []
        for index in range(KSR.pv.get("$hdrc(Record-Route)") or 0):
            value = KSR.pv.get(f"$(hdr(Record-Route)[{index}])") or ""
            routes += [part.strip() for part in value.split(",") if part.strip()]
        return routes

    @staticmethod
    def lookup(call_id: str) -> dict[str, str] | None:
        value = KSR.pv.get(f"$sht({CALLS}=>{call_id})")
        return json.loads(value) if value else None

    @staticmethod
    def end_service_call(location: str) -> None:
        try:
            http_request("DELETE", location)
        except OSError as exc:
            log("warn", f"DELETE {location} failed: {exc}")

    @staticmethod
    def forget_media(call_id: str, from_tag: str) -> None:
        try:
            ng.command(NG_ADDRESS, {"command": "delete", "call-id": call_id, "from-tag": from_tag})
        except (OSError, ng.NgError) as exc:
            log("warn", f"rtpengine delete for {call_id} failed: {exc}")
