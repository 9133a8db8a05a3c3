"""Start-up and shutdown of the whole service in one process (``--workers 0``)."""

from __future__ import annotations

from aiohttp import web

from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.server.app import new_runner
from voice_agent.server.app_keys import CALLS, LOOP_HEALTH
from voice_agent.server.drain import drain_app, stop_draining
from voice_agent.server.in_process_app import build_app, max_calls_of


class SingleServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = Engine(settings)
        self._app: web.Application | None = None
        self._runner: web.AppRunner | None = None

    async def listen(self) -> None:
        app = build_app(self.settings, self.engine)
        runner = new_runner(app)
        await runner.setup()
        await web.TCPSite(runner, self.settings.host, self.settings.port).start()
        if self.settings.metrics_port:  # /metrics only, no key (server/access.py)
            await web.TCPSite(runner, self.settings.host, self.settings.metrics_port).start()
        self._app, self._runner = app, runner

    async def start(self) -> None:
        assert self._app is not None, "listen() first"
        with self._app[LOOP_HEALTH].starting():
            await self.engine.start()
        # The capacity is known now (the turn's cost measured, or cached).
        self._app[CALLS].max_calls = max_calls_of(self.settings, self.engine)

    async def drain(self) -> None:
        """No new calls; the live ones finish or hear the goodbye (``server/drain.py``)."""
        if self._app is not None:
            await drain_app(self._app)

    async def stop(self) -> None:
        if self._app is not None:
            await stop_draining(self._app)
        if self._runner is not None:
            await self._runner.cleanup()
        await self.engine.stop()
