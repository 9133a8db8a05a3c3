"""What an idle call costs the server: connected, the caller silent.

For each server it starts the server in its own process, measures the CPU
(process and children) over a window with no call, then with N idle calls
connected (one client process at nice 10 holding them, sending silence as a
browser does), and reports the difference per call, in % of one core.

The baseline, in the same run, is a bare aiortc answerer (this file with
--bare-server): it answers offers, reads and decodes the caller's audio and
sends back silence that aiortc encodes frame by frame, with nothing else.

    .venv/bin/python bench/idle.py                      # 5 idle calls, 20 s
    .venv/bin/python bench/idle.py --calls 10 --window 30 --server-arg=--workers=0
    .venv/bin/python bench/idle.py --variant "no DTX=--no-output-dtx" --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from voice_agent.client import RealtimeClient
from voice_agent.rtc.call import restrict_host_addresses
from voice_agent.testing.figures import table
from voice_agent.testing.ports import free_port
from voice_agent.testing.serving import start_server, wait_ready

# ``python bench/<script>.py`` puts bench/ on the path, not the checkout's
# root, which the bench.* imports below are found from.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.load import CLIENT_NICE, cpu_seconds


async def bare_server(port: int) -> None:
    """The least a WebRTC audio answerer does: decode in, encode silence out."""
    from aiortc import RTCPeerConnection, RTCSessionDescription
    from aiortc.mediastreams import AudioStreamTrack, MediaStreamError

    restrict_host_addresses(["127.0.0.1"])
    peers: set[RTCPeerConnection] = set()

    async def drain(track: Any) -> None:
        try:
            while True:
                await track.recv()
        except MediaStreamError:
            pass

    async def offer(request: web.Request) -> web.Response:
        pc = RTCPeerConnection()
        peers.add(pc)
        pc.on("track", lambda track: asyncio.ensure_future(drain(track)))
        await pc.setRemoteDescription(RTCSessionDescription(await request.text(), "offer"))
        pc.addTrack(AudioStreamTrack())  # silence, encoded by aiortc every 20 ms
        await pc.setLocalDescription(await pc.createAnswer())
        return web.Response(
            status=201,
            text=pc.localDescription.sdp,
            content_type="application/sdp",
            headers={"Location": "/v1/realtime/calls/bare"},
        )

    async def ready(request: web.Request) -> web.Response:
        return web.json_response({"status": "ready"})

    app = web.Application()
    app.router.add_post("/v1/realtime/calls", offer)
    app.router.add_get("/readyz", ready)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    await asyncio.Event().wait()


async def hold_calls(url: str, calls: int, seconds: float) -> None:
    """The client side, in its own niced process: N connected, silent callers."""
    os.nice(CLIENT_NICE)
    restrict_host_addresses(["127.0.0.1"])
    async with aiohttp.ClientSession() as http:
        clients = [RealtimeClient(url) for _ in range(calls)]
        for client in clients:
            await client.connect(http)
        sys.stdout.write("connected\n")
        sys.stdout.flush()
        await asyncio.sleep(seconds)
        for client in clients:
            await client.hangup(http)


async def measure(url: str, pid: int, calls: int, window: float) -> tuple[float, float]:
    """Server CPU (% of a core) with no call, then with ``calls`` idle calls."""
    before = cpu_seconds(pid)
    await asyncio.sleep(window)
    idle = 100 * (cpu_seconds(pid) - before) / window
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--hold",
        url,
        "--calls",
        str(calls),
        "--window",
        str(window + 5),
        stdout=asyncio.subprocess.PIPE,
    )
    assert holder.stdout is not None
    await holder.stdout.readline()  # every call connected
    await asyncio.sleep(2)  # ICE, DTLS and the first RTCP settle
    before = cpu_seconds(pid)
    await asyncio.sleep(window)
    busy = 100 * (cpu_seconds(pid) - before) / window
    await holder.wait()
    return idle, busy


async def run(name: str, process: asyncio.subprocess.Process, url: str, args: Any) -> list[object]:
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url)
        idle, busy = await measure(url, process.pid, args.calls, args.window)
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()
    return [name, args.calls, f"{idle:.1f}", f"{busy:.1f}", f"{(busy - idle) / args.calls:.2f}"]


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=5, help="idle calls held at once")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured")
    parser.add_argument("--rounds", type=int, default=1, help="alternate the servers")
    parser.add_argument("--server-arg", action="append", default=[], help="serve flag")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="another voice-agent row: 'NAME=FLAG FLAG...' (repeatable)",
    )
    parser.add_argument("--hold", help=argparse.SUPPRESS)
    parser.add_argument("--bare-server", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.hold:
        await hold_calls(args.hold, args.calls, args.window)
        return
    if args.bare_server:
        await bare_server(args.bare_server)
        return
    variants = [("voice-agent", list[str]())]
    for variant in args.variant:
        name, _, flags = variant.partition("=")
        variants.append((f"voice-agent, {name}", flags.split()))
    rows: list[list[object]] = []
    for _ in range(args.rounds):
        for name, flags in variants:
            server, url = await start_server(
                "--max-calls", str(args.calls + 5), *args.server_arg, *flags
            )
            rows.append(await run(name, server, url, args))
        port = free_port()
        bare = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--bare-server", str(port)
        )
        rows.append(await run("bare aiortc", bare, f"http://127.0.0.1:{port}", args))
    print(f"\n## {args.calls} idle calls, {args.window:.0f} s windows\n")
    print(
        table(
            rows,
            ["server", "calls", "CPU % no call", "CPU % with calls", "CPU % per idle call"],
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
