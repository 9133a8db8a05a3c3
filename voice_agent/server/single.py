"""Start-up and shutdown of the whole service in one process (``--workers 1``)."""

from __future__ import annotations

from aiohttp import web

from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.server.app import build_app, new_runner


class SingleServer:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.engine = Engine(settings)
        self._runner: web.AppRunner | None = None

    async def listen(self) -> None:
        app = build_app(self.settings, self.engine)
        runner = new_runner(app)
        await runner.setup()
        await web.TCPSite(runner, self.settings.host, self.settings.port).start()
        self._runner = runner

    async def start(self) -> None:
        await self.engine.start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self.engine.stop()
