"""Many callers at once: N real WebRTC callers, each in its own client
process, each a multi-turn conversation of recorded human speech.

The server (``voice-agent serve``, embedded models) runs in its own process;
the callers run at a lower priority (nice 10), so on a shared machine the
server's CPU comes first and the clients' own work stays out of the result
as far as one machine allows. For each N it reports the client-measured
voice-to-voice time (end of the speech sent -> first audible audio back),
turns completed / failed / refused, outbound frames later than 20 ms, the
server's CPU and memory per call (its process and its children: the
llama.cpp server), and the server's own p50 per stage, in ms after the end
of speech (STT final, LLM first token, TTS first audio), with how many
replies were prepared speculatively.

    .venv/bin/python bench/load.py                       # N = 1, 2, 5, 10
    .venv/bin/python bench/load.py --callers 5 --turns 4
    .venv/bin/python bench/load.py --server-arg=--max-calls=5
    .venv/bin/python bench/load.py --cpus 0 --callers 2   # scaling: one core, then
    .venv/bin/python bench/load.py --cpus 0,1 --callers 4 # two, the same load a core
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import asdict
from pathlib import Path

import aiohttp

from voice_agent.rtc.call import restrict_host_addresses
from voice_agent.testing.figures import percentile, table
from voice_agent.testing.serving import start_server, wait_ready

# ``python bench/<script>.py`` puts bench/ on the path, not the checkout's
# root, which the bench.* imports below are found from.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.latency import Turn, one_call, rss_mb

CLIENT_NICE = 10


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its live children."""
    ticks = os.sysconf("SC_CLK_TCK")
    pids = [pid]
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        pids += [int(p) for p in children.read_text().split()]
    total = 0
    for each in pids:
        fields = Path(f"/proc/{each}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / ticks


async def client_main(url: str, index: int, turns: int, gap: float, delay: float) -> None:
    """One caller, in its own process: prints its turns as JSON."""
    os.nice(CLIENT_NICE)
    restrict_host_addresses(["127.0.0.1"])
    await asyncio.sleep(delay)  # staggered start, as callers arrive
    async with aiohttp.ClientSession() as http:
        out: dict[str, object]
        try:
            results, _ = await one_call(url, http, index, turns, gap)
            out = {"turns": [asdict(t) for t in results]}
        except RuntimeError as exc:  # the offer was refused (503: over capacity)
            out = {"refused": str(exc)}
    sys.stdout.write(json.dumps(out) + "\n")


async def run_callers(
    url: str, callers: int, turns: int, gap: float, stagger: float
) -> list[dict[str, object]]:
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--client",
            url,
            "--index",
            str(i),
            "--turns",
            str(turns),
            "--gap",
            str(gap),
            "--delay",
            str(i * stagger),
            stdout=asyncio.subprocess.PIPE,
        )
        for i in range(callers)
    ]
    outputs = await asyncio.gather(*(p.communicate() for p in processes))
    results: list[dict[str, object]] = []
    for process, (stdout, _) in zip(processes, outputs, strict=True):
        if process.returncode != 0 or not stdout.strip():
            results.append({"crashed": process.returncode})
            continue
        results.append(json.loads(stdout.decode().strip().splitlines()[-1]))
    return results


async def stats(http: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with http.get(url + "/v1/stats") as response:
        body: dict[str, object] = await response.json()
        return body


async def measure(
    http: aiohttp.ClientSession, url: str, pid: int, args: argparse.Namespace, callers: int
) -> list[object]:
    before = await stats(http, url)
    cpu_before, started = cpu_seconds(pid), time.monotonic()
    idle_rss = rss_mb(pid)
    peak_rss = idle_rss

    async def sample_memory() -> None:
        nonlocal peak_rss
        while True:  # a sampler in the bench, not on any media path
            peak_rss = max(peak_rss, rss_mb(pid))
            await asyncio.sleep(0.5)

    sampler = asyncio.create_task(sample_memory())
    results = await run_callers(url, callers, args.turns, args.gap, args.stagger)
    sampler.cancel()
    wall = time.monotonic() - started
    cpu = cpu_seconds(pid) - cpu_before
    after = await stats(http, url)
    turns = [Turn(**t) for r in results for t in r.get("turns", [])]  # type: ignore[attr-defined]
    refused = sum("refused" in r for r in results)
    crashed = sum("crashed" in r for r in results)
    completed = [t for t in turns if t.status == "completed" and t.client_ms is not None]
    failed = len(turns) - len(completed)
    v2v = [t.client_ms for t in completed if t.client_ms is not None]
    pacing_before, pacing_after = before["pacing"], after["pacing"]
    frames = pacing_after["frames"] - pacing_before["frames"]  # type: ignore[index]
    late = pacing_after["late_over_20ms"] - pacing_before["late_over_20ms"]  # type: ignore[index]
    served = max(1, callers - refused - crashed)

    def stage(key: str) -> str:
        values = [t.server[key] for t in completed if key in t.server]
        return f"{percentile(values, 50):.0f}" if values else "-"

    return [
        callers,
        len(completed),
        failed,
        refused,
        f"{percentile(v2v, 50):.0f}" if v2v else "-",
        f"{percentile(v2v, 95):.0f}" if v2v else "-",
        f"{late}/{frames}",
        f"{pacing_after['max_late_ms']:.0f}",  # type: ignore[index]
        f"{100 * cpu / wall / served:.0f}",
        f"{(peak_rss - idle_rss) / served:.0f}",
        stage("stt_final_after_speech_end_ms"),
        stage("llm_first_token_after_speech_end_ms"),
        stage("tts_first_audio_after_speech_end_ms"),
        f"{sum(t.speculative for t in completed)}/{len(completed)}",
    ]


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--callers", default="1,2,5,10", help="comma-separated N to run")
    parser.add_argument("--turns", type=int, default=4, help="turns per conversation")
    parser.add_argument("--gap", type=float, default=1.0, help="seconds between a caller's turns")
    parser.add_argument("--stagger", type=float, default=0.4, help="seconds between callers")
    parser.add_argument("--server-arg", action="append", default=[], help="serve flag")
    parser.add_argument(
        "--cpus",
        help="the server's cores, as taskset -c takes them (0 or 0,1); its defaults "
        "(workers, threads, --max-calls) follow them. The callers run on any core",
    )
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--delay", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        await client_main(args.client, args.index, args.turns, args.gap, args.delay)
        return

    cpus = {int(c) for c in args.cpus.split(",")} if args.cpus else None
    server, url = await start_server(*args.server_arg, cpus=cpus)
    rows: list[list[object]] = []
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url)
            # One warm-up conversation: first-use allocations are not per-call costs.
            await run_callers(url, 1, 1, 0.0, 0.0)
            for callers in (int(n) for n in args.callers.split(",")):
                rows.append(await measure(http, url, server.pid, args, callers))
                await asyncio.sleep(2.0)
    finally:
        server.send_signal(signal.SIGTERM)
        await server.wait()
    pinned = f", the server on cores {args.cpus}" if args.cpus else ""
    print(f"\n## {args.turns} turns per caller, callers {args.stagger} s apart{pinned}\n")
    print(
        table(
            rows,
            [
                "callers",
                "turns ok",
                "failed",
                "refused",
                "v2v p50 ms",
                "v2v p95 ms",
                "frames late>20ms",
                "max late ms",
                "server CPU %/call",
                "RSS MB/call",
                "STT p50",
                "LLM 1st p50",
                "TTS 1st p50",
                "speculative",
            ],
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
