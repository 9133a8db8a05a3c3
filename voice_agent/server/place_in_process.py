"""Calls that live in this process (one process, or a media worker behind
the front): made with the engine's models, kept in the ``CallRegistry``,
counted and hung up here."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from voice_agent.backends.capabilities import ReportsStats
from voice_agent.capacity import turn_cost_figures
from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.realtime.errors import error_event
from voice_agent.realtime.protocol import ClientEventError
from voice_agent.rtc.call import Call
from voice_agent.server.admission import Admission, server_full, shutting_down
from voice_agent.server.call_routes import CALLS_PATH
from voice_agent.server.calls import CallRegistry
from voice_agent.server.errors import error_response
from voice_agent.server.offer_sdp import check_parsed_offer
from voice_agent.server.offers import Offer
from voice_agent.server.place import CallPlace, LiveStats, Slot, Transport
from voice_agent.server.public_url import call_location
from voice_agent.server.websocket import MAX_FRAME_BYTES, SUBPROTOCOL
from voice_agent.session.ids import new_id
from voice_agent.ws.call import WebSocketCall

log = logging.getLogger(__name__)


class _Reservation(Slot):
    """A slot in the registry, held while the call is negotiated; the
    registry counts the call itself once it is added."""

    def __init__(self, registry: CallRegistry) -> None:
        self._registry = registry
        self._held = True

    def made(self, call_id: str) -> None:
        self.release()

    def release(self) -> None:
        if self._held:
            self._held = False
            self._registry.release_reservation()


class InProcess(CallPlace):
    """Where calls live when this process runs them: ``call_id_prefix``
    starts each call's id ("rtc"; "rtc_w3" in media worker 3, so the front
    can route a call's requests to the worker that owns it)."""

    def __init__(
        self,
        settings: Settings,
        engine: Engine,
        registry: CallRegistry,
        call_id_prefix: str = "rtc",
    ) -> None:
        self.settings = settings
        self.engine = engine
        self.registry = registry
        self.call_id_prefix = call_id_prefix

    # -- capacity and readiness ------------------------------------------------
    @property
    def calls(self) -> int:
        return len(self.registry)

    @property
    def full(self) -> bool:
        return self.registry.full

    @property
    def refused_full(self) -> int:
        return self.registry.refused_full

    def capacity(self) -> dict[str, Any]:
        registry = self.registry
        return {
            "calls": len(registry),
            "max_calls": registry.max_calls,
            "load": round(registry.load, 3),
        }

    def unready(self) -> tuple[str, str] | None:
        return None  # ready with the models and the LLM

    # -- admission and calls ----------------------------------------------------
    def check_offer(self, sdp: str) -> None:
        check_parsed_offer(sdp)

    def reserve(self, transport: Transport) -> Slot | web.Response:
        if not self.registry.reserve():
            self.registry.refused_full += 1
            return server_full(self.registry.max_calls)
        return _Reservation(self.registry)

    async def make_call(
        self, request: web.Request, admission: Admission[Any], offer: Offer
    ) -> web.StreamResponse:
        engine, calls = self.engine, self.registry
        models = engine.models
        assert models is not None  # admitted: not_serving refuses until they are loaded
        call: Call | None = None
        try:
            call = Call(
                new_id(self.call_id_prefix),
                self.settings,
                models,
                engine.session_config(),
                engine.model_name,
                engine.voice_name,
                on_closed=calls.discard,
            )
            if offer.session is not None:
                try:
                    call.protocol.apply_session_config(offer.session)
                except ClientEventError as exc:
                    await call.close("bad_session")
                    return error_response(400, "invalid_session", str(exc))
            answer = await call.answer(offer.sdp)
        except Exception as exc:
            if call is not None:
                await call.close("bad_offer")
            message = str(exc) or type(exc).__name__
            return error_response(400, "invalid_sdp", f"the offer could not be applied: {message}")
        except BaseException:  # cancelled (client gone, shutdown): release, then propagate
            if call is not None:
                await asyncio.shield(call.close("cancelled"))
            raise
        if (closing := shutting_down(request)) is not None:
            await call.close("server_shutdown")  # the drain began while it was negotiated
            return closing
        admission.made(call.id)
        calls.add(call)
        log.info("call created", extra={"call_id": call.id, "calls": len(calls)})
        location = call_location(self.settings.public_url, CALLS_PATH, call.id)
        return web.Response(
            status=201,
            text=answer,
            content_type="application/sdp",
            headers={"Location": location},
        )

    async def open_websocket(
        self,
        request: web.Request,
        admission: Admission[Any],
        call_id: str | None,
        session: dict[str, Any] | None,
    ) -> web.StreamResponse:
        engine, calls = self.engine, self.registry
        ws = web.WebSocketResponse(
            protocols=(SUBPROTOCOL,),
            max_msg_size=MAX_FRAME_BYTES,
            heartbeat=self.settings.ws_heartbeat_s,
        )
        if (closing := shutting_down(request)) is not None:
            return closing  # still an HTTP answer: the upgrade has not happened
        transport = request.transport  # aiohttp lets go of it once closing
        await ws.prepare(request)
        models = engine.models
        assert models is not None  # admitted: not_serving refuses until they are loaded
        call = WebSocketCall(
            call_id or new_id(self.call_id_prefix),
            self.settings,
            models,
            engine.session_config(),
            engine.model_name,
            engine.voice_name,
            ws,
            transport,
            on_closed=calls.discard,
        )
        admission.made(call.id)
        calls.add(call)
        # Until run() (whose own finally ends it), whatever goes wrong ends
        # the call here: registered, it would otherwise hold its slot.
        try:
            if session is not None:
                try:
                    call.protocol.apply_session_config(session)
                except ClientEventError as exc:
                    refusal = error_event("invalid_request_error", exc.code, str(exc), exc.param)
                    await ws.send_json({"event_id": new_id("event"), **refusal})
                    await call.close("bad_session")
                    return ws
        except BaseException:
            await call.close("internal_error")  # shielded: runs to its end
            raise
        log.info("websocket call created", extra={"call_id": call.id, "calls": len(calls)})
        await call.run()
        return ws

    async def describe_call(self, call_id: str) -> web.StreamResponse | None:
        call = self.registry.get(call_id)
        if call is None:
            return None
        echo = call.echo
        return web.json_response(
            {
                "id": call.id,
                "status": "active",
                # What the echo canceller removed while the agent spoke (None: off).
                "echo_cancel": None if echo is None else echo.stats.as_dict(),
            }
        )

    async def end_call(self, call_id: str) -> web.StreamResponse | None:
        call = self.registry.get(call_id)
        if call is None:
            return None
        await call.close("hangup")
        return web.Response(status=204)

    async def hold_call(
        self, call_id: str, held: bool, sending: bool = True
    ) -> web.StreamResponse | None:
        call = self.registry.get(call_id)
        if call is None:
            return None
        if not isinstance(call, Call):
            return error_response(409, "not_a_phone_call", "only WebRTC calls are put on hold")
        call.hold(held, sending)
        return web.json_response({"id": call.id, "held": call.held, "sending": call.caller_sends})

    async def press_digits(self, call_id: str, digits: str) -> web.StreamResponse | None:
        call = self.registry.get(call_id)
        if call is None:
            return None
        if not isinstance(call, Call):
            return error_response(409, "not_a_phone_call", "keys are pressed on WebRTC calls only")
        heard = [digit for digit in digits if call.press_key(digit, "sip-info")]
        return web.json_response({"digits": "".join(heard)})

    # -- stats and metrics --------------------------------------------------------
    async def live_stats(self) -> LiveStats:
        calls = self.registry
        pacing = calls.pacing()
        counts = {
            "calls": len(calls),
            "calls_total": calls.calls_total,
            "max_calls": calls.max_calls,
            "load": round(calls.load, 3),
            "turn_cost": turn_cost_figures(self.engine.turn_cost),
        }
        return LiveStats(
            counts=counts,
            pacing={
                "frames": pacing.frames,
                "audio_frames": pacing.audio_frames,
                "late_over_20ms": pacing.late_over_20ms,
                "max_late_ms": round(pacing.max_late_ms, 2),
                "resyncs": pacing.resyncs,
            },
            stt=self._stt_stats(),
        )

    def _stt_stats(self) -> dict[str, Any]:
        """The STT backend's own counters (batching, queue wait, inference)
        and each live session's STT latency."""
        engine = self.engine
        body = self._backend_stt_stats()
        body["hearing"] = engine.hearing.snapshot()
        body["end_of_turn"] = engine.end_of_turn.snapshot()
        body["sessions"] = [
            {"session": c.session.id, **c.session.stt_stats()} for c in self.registry.calls()
        ]
        return body

    def _backend_stt_stats(self) -> dict[str, Any]:
        stt = self.engine.models.stt if self.engine.models is not None else None
        return dict(stt.stats()) if isinstance(stt, ReportsStats) else {}

    def ended(self) -> dict[str, int]:
        return dict(self.registry.ended)

    def pacing_counters(self) -> dict[str, Any] | None:
        totals = self.registry.pacing()
        return {"frames": totals.frames, "late_over_20ms": totals.late_over_20ms}

    def stt_counters(self) -> dict[str, Any]:
        return {**self._backend_stt_stats(), "hearing": self.engine.hearing.snapshot()}

    async def exposition(self, own: bytes) -> bytes:
        return own
