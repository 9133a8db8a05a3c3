"""The gateway's defences (gateway.py runs them on every request, cheapest
first): floods dropped (pike), only trunks let in (by source address or
digest user), and each trunk held to its concurrent calls and its new
calls a minute, all before rtpengine or the service is asked anything.
A mixin of the gateway's Kamailio object; settings from the environment
(access.py)."""

from __future__ import annotations

import os
import time

import access
import KSR  # type: ignore[import-not-found]  # Kamailio's module, there only inside Kamailio

ACCESS = access.from_environment(os.environ)
FLOOD_CHECKS = int(os.environ.get("SIP_FLOOD_REQUESTS") or 0) > 0  # pike loaded (run-gateway)
# How long a trunk at its limit is told to wait: about a short call's length.
TRUNK_RETRY_AFTER_S = 10

TRUNK_CALLS = "trunk_calls"  # htable: trunk -> its calls being set up or answered
TRUNK_RATE = "trunk_rate"  # htable: trunk -> its bucket of new calls, "tokens stamp"
BANNED = "banned"  # htable: source address -> 1 while it is dropped as a flood


def header_value(text: str) -> str:
    """A caller-supplied value made safe for one HTTP header line."""
    return "".join(ch for ch in text if ch.isprintable())[:128]


def log(level: str, message: str) -> None:
    getattr(KSR, level)(f"voice-agent gateway: {message}\n")


class Defences:
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

    @staticmethod
    def trunk_busy(retry_after_s: int, why: str) -> None:
        """Stateless: a trunk over its limits costs no transaction either."""
        KSR.hdr.append_to_reply(f"Retry-After: {retry_after_s}\r\n")
        KSR.sl.sl_send_reply(503, f"Service Unavailable ({why})")
