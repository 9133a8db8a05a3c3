"""The application state that several server modules share, by key: each
process that faces clients (one process, the front, a media worker) keeps
its settings, engine, limits and where its calls live under these."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from aiohttp import web

from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.loop_health import LoopHealthMonitor
from voice_agent.server.limits import ClientRateLimiter
from voice_agent.server.place import CallPlace

if TYPE_CHECKING:  # the registry's module loads the media stack, which the front never needs
    from voice_agent.server.calls import CallRegistry

SETTINGS: web.AppKey[Settings] = web.AppKey("settings", Settings)
ENGINE: web.AppKey[Engine] = web.AppKey("engine", Engine)
# Where this process's calls live: its own registry, or the media workers.
PLACE: web.AppKey[CallPlace] = web.AppKey("place", CallPlace)
# The registry of calls in this process (one process, or a media worker).
CALLS: web.AppKey[CallRegistry] = web.AppKey("calls")
# Set once shutdown begins (an Event: the app itself is frozen by then).
SHUTTING_DOWN: web.AppKey[asyncio.Event] = web.AppKey("shutting_down", asyncio.Event)
OFFER_LIMITS: web.AppKey[ClientRateLimiter] = web.AppKey("offer_limits", ClientRateLimiter)
LOOP_HEALTH: web.AppKey[LoopHealthMonitor] = web.AppKey("loop_health", LoopHealthMonitor)
