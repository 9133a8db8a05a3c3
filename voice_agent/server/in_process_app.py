"""The whole service in one process's application: every call's peer
connection, session and media here. ``voice-agent serve --workers 0`` runs
one; with media workers each worker runs one behind the front
(``server/front.py``), which has admitted every call it forwards.
"""

from __future__ import annotations

import logging

from aiohttp import web

from voice_agent.audio import echo as echo_cancellation
from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.rtc import inline_decoding, opus_wideband
from voice_agent.rtc.call import restrict_host_addresses
from voice_agent.server.app import add_shared_routes, new_app
from voice_agent.server.app_keys import CALLS, ENGINE, SHUTTING_DOWN
from voice_agent.server.auth import AUTH
from voice_agent.server.call_routes import add_call_routes
from voice_agent.server.calls import CallRegistry
from voice_agent.server.debug import add_debug_routes
from voice_agent.server.drain import DRAINING
from voice_agent.server.place_in_process import InProcess

log = logging.getLogger(__name__)


def max_calls_of(settings: Settings, engine: Engine) -> int:
    """This server's capacity: its own --max-calls, else the engine's
    (measured from a turn's cost once the models are loaded)."""
    return settings.max_calls if settings.max_calls is not None else engine.max_calls


def build_app(
    settings: Settings, engine: Engine, call_id_prefix: str = "rtc", behind_front: bool = False
) -> web.Application:
    """The whole service in this process (``call_id_prefix``: its calls'
    ids begin so; ``behind_front``: the front admitted every offer)."""
    app = new_app(settings)
    restrict_host_addresses(settings.ice_host_addresses)
    inline_decoding.install()
    if settings.input_opus_16k:
        opus_wideband.available()  # finds and loads libopus now, not in a call's answer
    if settings.echo_cancel != "off":
        try:
            echo_cancellation.preload()
        except Exception:  # each call that needs it will say so
            log.exception("echo cancellation unavailable")
    app[ENGINE] = engine
    calls = app[CALLS] = CallRegistry(max_calls_of(settings, engine))
    app[DRAINING] = []
    calls.listeners.append(app[AUTH].on_call_change)
    add_call_routes(
        app, InProcess(settings, engine, calls, call_id_prefix), trust_front=behind_front
    )
    if settings.debug_endpoints:
        add_debug_routes(app, lambda: len(calls))
    add_shared_routes(app, settings, engine)

    async def on_shutdown(app: web.Application) -> None:
        app[SHUTTING_DOWN].set()  # no new calls while the live ones are closed
        await app[CALLS].close_all("server_shutdown")

    app.on_shutdown.append(on_shutdown)
    return app
