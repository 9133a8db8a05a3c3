"""The gateway's answered calls, in a Kamailio htable that all its worker
processes share (Call-ID -> the call as JSON): looked up, stored again and
taken out under the key's lock, so a caller's BYE and the service's end
that cross are handled once. A mixin of the gateway's Kamailio object."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import KSR  # type: ignore[import-not-found]  # Kamailio's module, there only inside Kamailio

CALLS = "calls"  # htable (shared by Kamailio's processes): Call-ID -> the call, as JSON


class CallTable:
    def free_slot(self, trunk: str) -> None:  # the trunk's count (defences.py)
        raise NotImplementedError

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

    @staticmethod
    def replace_call(call_id: str, call: dict[str, Any]) -> bool:
        """The call stored again as it is now, unless it has ended meanwhile."""
        KSR.htable.sht_lock(CALLS, call_id)
        try:
            if KSR.htable.sht_get(CALLS, call_id) is None:
                return False
            KSR.htable.sht_sets(CALLS, call_id, json.dumps(call))
            return True
        finally:
            KSR.htable.sht_unlock(CALLS, call_id)

    def take_call(
        self, call_id: str, only_if: Callable[[dict[str, Any]], bool] | None = None
    ) -> dict[str, Any] | None:
        """The call, taken out of the table by one taker only: the caller's BYE
        and the service's end can cross, and the trunk's slot is given back once.
        ``only_if``: a check of the call as stored now (else it stays)."""
        KSR.htable.sht_lock(CALLS, call_id)
        try:
            call = self.lookup(call_id)
            if call is not None and only_if is not None and not only_if(call):
                call = None
            if call is not None:
                KSR.htable.sht_rm(CALLS, call_id)
        finally:
            KSR.htable.sht_unlock(CALLS, call_id)
        if call is not None:
            self.free_slot(call["trunk"])
        return call
