"""Graceful drain, on SIGTERM (a rolling update, a scale-down, ``docker stop``).

New calls are refused at once (503 with Retry-After, ``/readyz`` 503
``draining``), so a load balancer sends them elsewhere, and so are offers
admitted before, still being negotiated, once answered; live calls go on
for up to ``--drain-timeout-s``; each one still live then hears the
goodbye (whatever it was saying stops; no LLM; the caller cannot start
another turn), gets its ``response.done``, and is hung up. Then the
process exits 0. One drain per application: asking again (a second
route call, SIGTERM reaching a worker and its parent) waits for the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

from aiohttp import web

from voice_agent.server.app_keys import CALLS, SETTINGS, SHUTTING_DOWN

if TYPE_CHECKING:  # the calls' module loads the media stack; the front only forwards a drain
    from voice_agent.server.calls import Call, CallRegistry

log = logging.getLogger(__name__)

DRAIN_PATH = "/internal/drain"
# The goodbye's own bound: a sentence, played in real time, with slack for
# a TTS busy with every other call's goodbye at the same moment.
GOODBYE_LIMIT_S = 10.0

DRAINING: web.AppKey[list[asyncio.Task[None]]] = web.AppKey("draining", list)


async def drain_app(app: web.Application) -> None:
    """Stop taking calls, let the live ones finish, end the rest (see above)."""
    app[SHUTTING_DOWN].set()
    running = app[DRAINING]
    if not running:
        settings = app[SETTINGS]
        drain = drain_calls(app[CALLS], settings.drain_timeout_s, settings.drain_goodbye)
        running.append(asyncio.create_task(drain, name="drain"))
    await asyncio.shield(running[0])


async def drain_calls(calls: CallRegistry, timeout_s: float, goodbye: str) -> None:
    if len(calls):
        log.info("draining", extra={"calls": len(calls), "timeout_s": timeout_s})
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await calls.wait_until_idle()
    goodbyes_began = asyncio.get_running_loop().time()
    left = calls.calls()
    if left:
        log.info("drain time is up: ending calls with a goodbye", extra={"calls": len(left)})
    ended = await asyncio.gather(
        *(end_with_goodbye(call, goodbye) for call in left), return_exceptions=True
    )
    # An offer admitted before the drain began is refused once its answer is
    # ready (a call is never made while draining): it is answered 503 and
    # can go to another replica, where an exit now would cut it off. It had
    # the drain time, and gets what is left of the goodbyes' bound too.
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout_at(goodbyes_began + GOODBYE_LIMIT_S):
            await calls.wait_for_negotiations()
    for call, outcome in zip(left, ended, strict=True):
        if isinstance(outcome, Exception):  # one call's failure ends no other's goodbye
            log.error("ending a call failed", exc_info=outcome, extra={"call_id": call.id})


async def stop_draining(app: web.Application) -> None:
    """Stop a drain still running (a second signal, the parent gone), so no
    goodbye is still being played while the application shuts down."""
    for task in app.get(DRAINING, []):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def end_with_goodbye(call: Call, goodbye: str) -> None:
    try:
        # A call already closing (hung up as the drain time ran out) has
        # nobody left to hear it.
        response = None if call.closing else call.session.say_goodbye(goodbye)
        if response is not None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(GOODBYE_LIMIT_S):
                    await response.wait_closed()
    except Exception:  # the call still ends
        log.exception("the goodbye failed", extra={"call_id": call.id})
    await call.close("server_shutdown")


async def drain_route(request: web.Request) -> web.StreamResponse:
    """The front's order to a media worker (``--workers``): answered once drained."""
    await drain_app(request.app)
    return web.json_response({"drained": True})
