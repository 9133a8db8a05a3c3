"""The browser SDK at a stable path, for pages on any allowed origin.

``/sdk/voice-agent.js`` is an ES module that imports its three companions
beside it (relative imports, so they resolve under ``/sdk/`` wherever the
SDK is served from); browsers import modules across
origins in CORS mode, so the CORS middleware's allow-list decides which
origins may use it. Content types are fixed here rather than guessed from the
extension: ``.d.ts`` would otherwise be served as a Qt translation file.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

SDK_PATH = "/sdk"
JS = "text/javascript; charset=utf-8"
SDK_FILES = {
    "voice-agent.js": JS,
    "voice-agent-events.js": JS,
    "voice-agent-media.js": JS,
    "voice-agent-errors.js": JS,
    "voice-agent.d.ts": "application/typescript; charset=utf-8",
}


def web_dir() -> Path | None:
    """The demo page and the SDK: inside the installed package (a wheel
    carries them as ``voice_agent/web``), else beside it in a checkout (an
    editable install); None when neither has them."""
    here = Path(__file__).resolve()
    for candidate in (here.parents[1] / "web", here.parents[2] / "web"):
        if (candidate / "index.html").is_file():
            return candidate
    return None


def add_sdk_routes(app: web.Application, web_dir: Path) -> None:
    for name, content_type in SDK_FILES.items():
        path = web_dir / name
        if not path.is_file():
            continue

        async def serve(
            request: web.Request, path: Path = path, content_type: str = content_type
        ) -> web.StreamResponse:
            # Revalidated on every load (ETag/Last-Modified): an upgraded
            # server is picked up by pages at once.
            headers = {"Content-Type": content_type, "Cache-Control": "no-cache"}
            return web.FileResponse(path, headers=headers)

        app.router.add_get(f"{SDK_PATH}/{name}", serve)
