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

Before any of that, every request passes the gateway's defences, cheapest
first, so that what an attacker can make it do costs little:

flood    a source sending more than its share of requests (pike) is
         dropped without an answer for a while (SIP_FLOOD_*);
access   only trunks may start anything: a listed source address
         (SIP_ALLOWED_SOURCES) or a digest user (SIP_AUTH_FILE, challenged
         with 407, or 401 for REGISTER); others get 403, statelessly;
calls    each trunk has its own limits on concurrent calls (counted from the
         INVITE on, so calls being set up count too) and on new calls a
         minute; beyond either: 503 with Retry-After, before rtpengine or the
         service is asked anything.

Settings come from the environment (see run-gateway and access.py).
"""

from __future__ import annotations

import http.client
import json
import math
import os
import sys
import time
import urllib.parse
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import access
import KSR  # type: ignore[import-not-found]  # Kamailio's module, there only inside Kamailio
import ng

SERVICE = urllib.parse.urlsplit(os.environ.get("VOICE_AGENT_URL", "http://127.0.0.1:8080"))
API_KEY = os.environ.get("VOICE_AGENT_API_KEY", "")
NG_HOST, _, NG_PORT = os.environ.get("RTPENGINE_NG", "127.0.0.1:2223").rpartition(":")
NG_ADDRESS = (NG_HOST, int(NG_PORT))
CONTACT = os.environ.get("GATEWAY_CONTACT", "sip:agent@127.0.0.1:5060")
HTTP_TIMEOUT_S = float(os.environ.get("VOICE_AGENT_TIMEOUT_S", "15"))
CALLS_PATH = SERVICE.path.rstrip("/") + "/v1/realtime/calls"
ACCESS = access.from_environment(os.environ)
FLOOD_CHECKS = int(os.environ.get("SIP_FLOOD_REQUESTS") or 0) > 0  # pike loaded (run-gateway)
# How long a trunk at its limit is told to wait: about a short call's length.
TRUNK_RETRY_AFTER_S = 10

CALLS = "calls"  # htable (shared by Kamailio's processes): Call-ID -> the call, as JSON
CANCELLED = "cancelled"  # htable: Call-ID -> 1 once the caller has cancelled
TRUNK_CALLS = "trunk_calls"  # htable: trunk -> its calls being set up or answered
TRUNK_RATE = "trunk_rate"  # htable: trunk -> its bucket of new calls, "tokens stamp"
BANNED = "banned"  # htable: source address -> 1 while it is dropped as a flood

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
            KSR.sl.sl_send_reply(200, "OK")
        elif method == "REGISTER":
            self.register()
        elif method == "BYE":
            KSR.sl.sl_send_reply(481, "Call/Transaction Does Not Exist")  # no To tag: no call
        else:
            KSR.sl.sl_send_reply(501, "Not Implemented")
        return 1

    def ksr_reply_route(self, msg: object) -> int:
        """Replies (to the BYEs this side sends) go on to tm as they are."""
        return 1

    # -- the defences ------------------------------------------------------------
    def flooding(self) -> bool:
        """Whether this request's source is dropped as a flood (pike).

        pike sees every request, banned sources' too, so a source that keeps
        flooding stays red and its ban is renewed; the ban (an htable entry
        that expires SIP_FLOOD_BLOCK_S after the last renewal) then outlasts
        the burst, which pike's own blocking (lifted the first quiet sampling
        interval) would not."""
        if not FLOOD_CHECKS:
            return False
        source = KSR.pv.get("$si")
        verdict = KSR.pike.pike_check_req()
        if verdict < 0:
            if verdict == -2:  # first detected: once per burst in the log, not per request
                log("warn", f"flood from {source}: dropping its requests")
            KSR.htable.sht_seti(BANNED, source, 1)
            return True
        return KSR.htable.sht_get(BANNED, source) is not None

    @staticmethod
    def retransmission() -> bool:
        """An INVITE repeated while the first is handled or answered: the
        transaction it repeats absorbs it (never a second service call). This
        comes before the access checks, so that a repeat is neither challenged
        again nor counted against its trunk's limit."""
        if KSR.tmx.t_precheck_trans() > 0:
            KSR.tm.t_check_trans()
            return True
        return bool(KSR.tm.t_check_trans() == 0)

    def trunk_of_request(self, method: str) -> str | None:
        """The trunk this out-of-dialog request comes from, or None when it is
        refused (403) or challenged (401/407): replied to either way, statelessly,
        so a stranger's requests leave no transaction behind."""
        source: str = KSR.pv.get("$si")
        if (trunk := ACCESS.trunk_of_source(source)) is not None:
            return trunk
        if ACCESS.open:
            return source  # every address its own trunk, with its own call limit
        if ACCESS.users and method in ("INVITE", "REGISTER"):
            return self.authenticate(source)
        log("info", f"refused {method} from {source}: not a trunk")
        KSR.sl.sl_send_reply(403, "Forbidden")
        return None

    def authenticate(self, source: str) -> str | None:
        realm = ACCESS.realm
        if KSR.auth.has_credentials(realm) < 0:
            KSR.auth.auth_challenge(realm, 1)  # 407 (401 for REGISTER), qop=auth
            return None
        user = KSR.pv.get("$au") or ""
        password = ACCESS.users.get(user)
        # Flags 0: the password is plain text; checks 0: a trunk's From user is
        # whatever number calls, not its username. -3: no such user.
        verdict = KSR.auth.pv_auth_check(realm, password, 0, 0) if password else -3
        if verdict > 0:
            return user
        if verdict in (-4, -6):  # an old nonce: the right password, asked again
            KSR.auth.auth_challenge(realm, 1 | 16)  # stale=true
            return None
        # A wrong password or user gets no second chance on this request:
        # another challenge would only invite guessing (pike bounds the rate).
        log("warn", f"refused digest user {header_value(user)!r} from {source} ({verdict})")
        KSR.sl.sl_send_reply(403, "Forbidden")
        return None

    @staticmethod
    def take_slot(trunk: str) -> bool:
        """One more call for the trunk, unless it is at its limit. The count
        and its change are one step under the key's lock: Kamailio's
        workers take INVITEs in parallel."""
        limit = ACCESS.limit_of(trunk)
        KSR.htable.sht_lock(TRUNK_CALLS, trunk)
        try:
            calls = int(KSR.htable.sht_get(TRUNK_CALLS, trunk) or 0)
            if limit and calls >= limit:
                return False
            KSR.htable.sht_seti(TRUNK_CALLS, trunk, calls + 1)
            return True
        finally:
            KSR.htable.sht_unlock(TRUNK_CALLS, trunk)

    @staticmethod
    def take_token(trunk: str) -> float:
        """A new call from the trunk's bucket (its calls a minute, refilled
        evenly, so no minute's edge lets twice as many through): 0 when
        taken, else the seconds until there is one."""
        rate = ACCESS.rate_of(trunk)
        if not rate:
            return 0.0
        now = time.monotonic()  # one clock for all of Kamailio's processes
        KSR.htable.sht_lock(TRUNK_RATE, trunk)
        try:
            tokens = float(rate)  # a trunk not seen for a while: a full bucket
            value = KSR.htable.sht_get(TRUNK_RATE, trunk)
            if isinstance(value, str) and " " in value:
                left, then = (float(part) for part in value.split(" ", 1))
                tokens = min(float(rate), left + (now - then) * rate / 60)
            if tokens < 1:
                return (1 - tokens) * 60 / rate
            KSR.htable.sht_sets(TRUNK_RATE, trunk, f"{tokens - 1:.6f} {now:.6f}")
            return 0.0
        finally:
            KSR.htable.sht_unlock(TRUNK_RATE, trunk)

    @staticmethod
    def free_slot(trunk: str) -> None:
        KSR.htable.sht_lock(TRUNK_CALLS, trunk)
        try:
            calls = int(KSR.htable.sht_get(TRUNK_CALLS, trunk) or 0)
            if calls > 1:
                KSR.htable.sht_seti(TRUNK_CALLS, trunk, calls - 1)
            else:  # gone at 0: an open gateway sees many addresses, each once
                KSR.htable.sht_rm(TRUNK_CALLS, trunk)
        finally:
            KSR.htable.sht_unlock(TRUNK_CALLS, trunk)

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

    @staticmethod
    def trunk_busy(retry_after_s: int, why: str) -> None:
        """Stateless: a trunk over its limits costs no transaction either."""
        KSR.hdr.append_to_reply(f"Retry-After: {retry_after_s}\r\n")
        KSR.sl.sl_send_reply(503, f"Service Unavailable ({why})")

    def set_up(self, trunk: str) -> bool:
        """The call, from the phone's offer to 200 OK: True once answered."""
        if KSR.tm.t_newtran() < 0:
            KSR.sl.sl_reply_error()
            return False
        call_id, from_tag = KSR.pv.get("$ci"), KSR.pv.get("$ft")
        body = KSR.pv.get("$rb") or ""
        if "m=audio" not in body:
            # A late offer (no SDP) would need the service to offer: not supported.
            KSR.tm.t_reply(488, "Not Acceptable Here (an SDP offer is required)")
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
                    "X-Caller-Id": header_value(KSR.pv.get("$fU") or ""),
                    "X-Called-Number": header_value(KSR.pv.get("$rU") or ""),
                },
            )
        except OSError as exc:
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
            "from": KSR.pv.get("$tu"),
            "to": KSR.pv.get("$fu"),
            "target": KSR.pv.get("$ct") or "",
            "routes": self.record_routes(),
            "answer": phone_answer,
            # Whose slot the call holds, and where its in-dialog requests may
            # come from besides the trunk's listed addresses.
            "trunk": trunk,
            "source": KSR.pv.get("$si"),
        }
        KSR.htable.sht_sets(CALLS, call_id, json.dumps(call))
        KSR.hdr.append_to_reply(f"Contact: <{CONTACT}>\r\n")
        KSR.textops.set_reply_body(phone_answer, "application/sdp")
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
        elif method == "INVITE":
            self.reinvite(call)
        elif method == "BYE":
            self.bye(call_id)
        else:
            KSR.sl.sl_send_reply(501, "Not Implemented")

    def reinvite(self, call: dict[str, Any]) -> None:
        """A session refresh keeps the media as it is (no hold, no codec change)."""
        if KSR.tm.t_newtran() < 0:
            KSR.sl.sl_reply_error()
            return
        KSR.hdr.append_to_reply(f"Contact: <{CONTACT}>\r\n")
        KSR.textops.set_reply_body(call["answer"], "application/sdp")
        KSR.tm.t_reply(200, "OK")

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
        """Every second (rtimer): a BYE for each call the service has ended."""
        ended: list[tuple[str, dict[str, Any]]] = []
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
    def lookup(call_id: str) -> dict[str, Any] | None:
        # sht_get, not $sht(...): a Call-ID is the caller's text, never parsed as a name.
        value = KSR.htable.sht_get(CALLS, call_id)
        return json.loads(value) if isinstance(value, str) and value else None

    def take_call(self, call_id: str) -> dict[str, Any] | None:
        """The call, taken out of the table by one taker only: the caller's BYE
        and the service's end can cross, and the trunk's slot is given back once."""
        KSR.htable.sht_lock(CALLS, call_id)
        try:
            call = self.lookup(call_id)
            if call is not None:
                KSR.htable.sht_rm(CALLS, call_id)
        finally:
            KSR.htable.sht_unlock(CALLS, call_id)
        if call is not None:
            self.free_slot(call["trunk"])
        return call

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
