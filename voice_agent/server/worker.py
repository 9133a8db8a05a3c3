"""One media worker process (``voice-agent serve --workers N``).

It runs the ordinary single-process application (``server/app.py``: calls,
peer connections, sessions) on a private Unix socket behind the front,
without model weights: STT and TTS are its parent's, reached over the
parent's speech socket, and the LLM is the parent's endpoint. So media and
session work (aiortc's per-packet Python, turn detection, protocol) spreads
over N processes and N cores, while each model is loaded once and batches
across every worker's calls.

The parent starts it while its own models load and writes two JSON lines
on stdin: at once, who it is and the settings (index, socket path,
settings), on which it imports and loads its own small models (the VAD, the
end-of-turn model) meanwhile; then, once the parent's models are up, where
they are and the capacity. It keeps stdin open: end of file means the
parent is gone (or wants this worker stopped now), and the worker closes
its calls and exits.
SIGTERM (or the parent's ``POST /internal/drain``) drains it first: no new
calls, the live ones finish or hear the goodbye (``server/drain.py``). It
answers ``ready`` on stdout once it listens. ``GET /internal/calls/events``
streams its calls as they start and end (NDJSON), which is how the parent
counts and routes calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys

from aiohttp import web

from voice_agent.config import Settings
from voice_agent.engine import Engine, SharedModelLinks
from voice_agent.model_loading import LocalModels, load_local_models, prepare_process
from voice_agent.server.app import new_runner
from voice_agent.server.app_keys import CALLS, LOOP_HEALTH
from voice_agent.server.drain import DRAIN_PATH, drain_app, drain_route, stop_draining
from voice_agent.server.in_process_app import build_app
from voice_agent.server.worker_protocol import EVENTS_PATH, WorkerConfig, WorkerLinks

log = logging.getLogger("voice_agent.server.worker")  # run as __main__

# Call starts and ends, not frames: a parent this far behind has lost track,
# so the stream ends and the parent subscribes again for a fresh snapshot.
MAX_PENDING_EVENTS = 1024


async def call_events(request: web.Request) -> web.StreamResponse:
    """This worker's live calls, then each start and end, one JSON per line."""
    calls = request.app[CALLS]
    pending: asyncio.Queue[str | None] = asyncio.Queue(MAX_PENDING_EVENTS)

    def listener(kind: str, call_id: str) -> None:
        try:
            pending.put_nowait(json.dumps({kind: call_id}) + "\n")
        except asyncio.QueueFull:
            with contextlib.suppress(asyncio.QueueFull):
                pending.get_nowait()
                pending.put_nowait(None)  # ends the stream: the parent resubscribes

    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    calls.listeners.append(listener)
    try:
        await response.write((json.dumps({"live": [c.id for c in calls.calls()]}) + "\n").encode())
        while (line := await pending.get()) is not None:
            await response.write(line.encode())
    finally:
        calls.listeners.remove(listener)
    return response


async def run_worker(
    config: WorkerConfig,
    settings: Settings,
    links: SharedModelLinks,
    local: LocalModels,
    parent_gone: asyncio.Future[None],
) -> None:
    engine = Engine(settings, links)
    app = build_app(settings, engine, config.call_id_prefix(), behind_front=True)
    app.router.add_get(EVENTS_PATH, call_events)
    app.router.add_post(DRAIN_PATH, drain_route)
    runner = new_runner(app)
    await runner.setup()
    loop = asyncio.get_running_loop()
    stop: asyncio.Future[str] = loop.create_future()

    def stop_with(how: str) -> None:
        if not stop.done():
            stop.set_result(how)

    # Ctrl-C reaches the whole process group: the parent orders the shutdown.
    loop.add_signal_handler(signal.SIGINT, lambda: None)
    # SIGTERM reaching every process (systemd's control group): drain here too.
    loop.add_signal_handler(signal.SIGTERM, stop_with, "drain")
    parent_gone.add_done_callback(lambda _: stop_with("now"))
    try:
        with app[LOOP_HEALTH].starting():
            await engine.start(local)
        await web.UnixSite(runner, config.socket).start()
        sys.stdout.write("ready\n")
        sys.stdout.flush()
        log.info("worker listening", extra={"socket": config.socket})  # the tag names it
        if await stop == "drain":
            draining = asyncio.ensure_future(drain_app(app))
            await asyncio.wait({draining, parent_gone}, return_when=asyncio.FIRST_COMPLETED)
            draining.cancel()
    finally:
        await stop_draining(app)
        await runner.cleanup()  # closes this worker's calls
        await engine.stop()


async def main_async() -> None:
    loop = asyncio.get_running_loop()
    stdin = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(stdin), sys.stdin)
    line = await stdin.readline()
    if not line.strip():
        return  # the parent went away (or stopped) before it sent the configuration
    config = WorkerConfig(**json.loads(line))
    from voice_agent.logs import configure

    configure(
        config.settings.get("log_level", "INFO"),
        config.settings.get("log_format", "json"),
        worker=config.index,
    )
    settings = Settings(**config.settings)
    # SIGTERM before run_worker's handler: no call is held yet, so the
    # worker only finishes the load under way and leaves.
    terminated = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, terminated.set)
    log.info("worker loading its models")
    prepare_process(settings)
    local = await load_local_models(settings, hosts_sessions=True, warm=True)
    second = asyncio.ensure_future(stdin.readline())
    ended = asyncio.ensure_future(terminated.wait())
    await asyncio.wait({second, ended}, return_when=asyncio.FIRST_COMPLETED)
    ended.cancel()
    line = second.result() if second.done() and not terminated.is_set() else b""
    second.cancel()
    if not line.strip():  # the parent went away (or stopped it) while its models loaded
        if local.turn is not None:
            local.turn.close()
        return
    linked = WorkerLinks(**json.loads(line))
    settings = settings.model_copy(update={"max_calls": linked.max_calls})
    parent_gone: asyncio.Future[None] = loop.create_future()

    def gone(_: object) -> None:
        if not parent_gone.done():
            parent_gone.set_result(None)

    watch = asyncio.create_task(stdin.read())  # returns at end of file
    watch.add_done_callback(gone)
    try:
        await run_worker(config, settings, SharedModelLinks(**linked.links), local, parent_gone)
    finally:
        watch.cancel()


def main() -> None:
    # Ctrl-C reaches the whole process group, this worker too, even while it
    # waits for its configuration: the parent orders the shutdown.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(main_async())


if __name__ == "__main__":
    main()
