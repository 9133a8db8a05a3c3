"""Memory over many calls: does the server give back what each call took?

Starts ``voice-agent serve`` (embedded models, ``--debug-endpoints``) in its
own process, laid out as a 2-core host with a capacity of 5 calls runs it:
the front, one media worker (``--workers 1``; ``--server-arg=--workers=0``
for one process) and the llama-server child. Then it runs M sequential calls and R
rounds of 5 concurrent calls. Each call is short and real: an aiortc caller
in its own client process (nice 10, as in bench/load.py), one spoken turn
of a LibriVox recording, waiting for ``response.done``, then a hang-up.
Every K calls, once the calls have ended, it samples the service: the RSS
of the front, of each media worker and of llama-server, each on its own;
open fds and threads; and, from ``/debug/memory`` (the front's and each
worker's), asyncio tasks, live aiortc objects by type and the front's
glibc heap (bytes in use vs. free but kept, arenas). After the calls it
waits ``--quiet-s`` (35 s) without one and samples once more: what the
service gives back once idle (Piper's arenas, after 30 s). It prints a
table and the growth after warm-up: RSS MB per 100 calls (least-squares slope) and each
counter's change; then the object types and (with --tracemalloc) the
allocating lines that grew most.

    .venv/bin/python bench/soak.py --calls 1000 --rounds 100
    .venv/bin/python bench/soak.py --prompt please-try-call-later \
        --server-arg=--llm-max-tokens --server-arg=12           # short calls
    .venv/bin/python bench/soak.py --calls 30 --rounds 4 --every 10 --warmup 10
    .venv/bin/python bench/soak.py --jemalloc           # the server on jemalloc
    .venv/bin/python bench/soak.py --server-arg=--no-malloc-trim   # glibc keeps what calls free
    .venv/bin/python bench/soak.py --tracemalloc 1      # + Python allocation growth

Samples are taken after the endpoint's ``gc.collect()``, so garbage waiting
for the cycle collector is not counted as held.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from voice_agent.rtc.call import restrict_host_addresses
from voice_agent.testing.audio_data import silence, telephone_prompt
from voice_agent.testing.figures import table
from voice_agent.testing.serving import start_server, wait_ready

# ``python bench/<script>.py`` puts bench/ on the path, not the checkout's
# root, which the bench.* imports below are found from.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.latency import connected, one_call, reply_heard
from bench.load import CLIENT_NICE
from bench.soak_samples import MB, OBJECTS, Sample, sample, slope_per_100

CONCURRENT = 5
JEMALLOC = "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"


# -- the caller: a client process taking one call per line on stdin --------
async def prompted_call(url: str, http: aiohttp.ClientSession, prompt: np.ndarray) -> str:
    """A call of one short turn (a telephone prompt), its reply heard out;
    its response's status."""
    client, _ = await connected(url, http)
    try:
        mark = len(client.events)
        done = client.wait_for(lambda e: e.get("type") == "response.done", after=mark)
        await client.mic.play(np.concatenate((prompt, silence(0.6))), 16000)
        response = (await asyncio.wait_for(done, 60))["response"]
        await reply_heard(client, response["id"], mark)
        return str(response["status"])
    finally:
        await client.hangup(http)


async def client_main(url: str, index: int, prompt_name: str | None) -> None:
    """Runs a call for each line read; prints each outcome as a JSON line."""
    os.nice(CLIENT_NICE)
    restrict_host_addresses(["127.0.0.1"])
    loop = asyncio.get_running_loop()
    commands = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(commands), sys.stdin)
    calls = 0
    prompt = None if prompt_name is None else telephone_prompt(prompt_name)
    async with aiohttp.ClientSession() as http:
        while await commands.readline():
            out: dict[str, Any]
            try:
                if prompt is not None:
                    out = {"status": await prompted_call(url, http, prompt), "ms": None}
                else:
                    # One turn; the clip rotates with the index (bench.latency.CLIPS).
                    turns, _ = await one_call(url, http, index + calls, 1, 0.0)
                    out = {"status": turns[0].status, "ms": turns[0].client_ms}
            except (RuntimeError, TimeoutError, aiohttp.ClientError) as exc:
                out = {"status": "error", "error": str(exc) or type(exc).__name__}
            calls += 1
            sys.stdout.write(json.dumps(out) + "\n")
            sys.stdout.flush()


class Caller:
    """The controller's handle on one client process."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, url: str, index: int, prompt: str | None) -> Caller:
        chosen = ["--prompt", prompt] if prompt else []
        process = await asyncio.create_subprocess_exec(
            *(sys.executable, __file__, "--client", url, "--index", str(index), *chosen),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        return cls(process)

    async def call(self) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(b"call\n")
        await self.process.stdin.drain()
        line = await self.process.stdout.readline()
        if not line:
            return {"status": "crashed", "error": f"client exited {self.process.returncode}"}
        outcome: dict[str, Any] = json.loads(line)
        return outcome

    async def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        await self.process.wait()


# -- the run -----------------------------------------------------------------
@dataclass
class Run:
    http: aiohttp.ClientSession
    url: str
    pid: int
    args: argparse.Namespace
    callers: list[Caller]
    samples: list[Sample] = field(default_factory=list)
    outcomes: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    calls: int = 0
    baseline: Sample | None = None

    async def calls_ended(self, outcomes: list[dict[str, Any]]) -> None:
        for outcome in outcomes:
            self.outcomes[outcome["status"]] = self.outcomes.get(outcome["status"], 0) + 1
            if "error" in outcome:
                self.errors.append(outcome["error"])
        self.calls += len(outcomes)

    async def maybe_sample(self, phase: str, previous: int) -> None:
        every, warmup = self.args.every, self.args.warmup
        at_warmup = self.baseline is None and self.calls >= warmup
        at_end = self.calls >= self.args.calls + CONCURRENT * self.args.rounds
        if self.calls // every == previous // every and not (at_warmup or at_end):
            return
        await asyncio.sleep(self.args.settle)  # transports wind down after the hang-up
        # Object counts by type at both ends: what grew in between.
        types = at_warmup or at_end
        taken = await sample(self.http, self.url, self.pid, phase, self.calls, types)
        self.samples.append(taken)
        if at_warmup:
            self.baseline = taken
            if self.args.tracemalloc:
                async with self.http.post(self.url + "/debug/tracemalloc"):
                    pass
        print(
            f"[{time.strftime('%H:%M:%S')}] {phase} {self.calls} calls: "
            f"RSS {taken.rss_mb:.0f} MB, workers {' '.join(f'{w:.0f}' for w in taken.workers_mb)}"
            f" MB, llama-server {taken.llm_mb:.0f} MB, "
            f"tasks {taken.tasks}, pcs {taken.objects['RTCPeerConnection']}",
            file=sys.stderr,
            flush=True,
        )

    async def sequential(self, count: int) -> None:
        for _ in range(count):
            previous = self.calls
            await self.calls_ended([await self.callers[0].call()])
            await self.maybe_sample("sequential", previous)

    async def concurrent(self, rounds: int) -> None:
        for _ in range(rounds):
            previous = self.calls
            await self.calls_ended(await asyncio.gather(*(c.call() for c in self.callers)))
            await self.maybe_sample(f"{CONCURRENT} at once", previous)


def report(run: Run, wall_s: float) -> None:
    args = run.args
    allocator = "jemalloc" if args.jemalloc else "glibc malloc"
    extras = f", server flags {' '.join(args.server_arg)}" if args.server_arg else ""
    print(
        f"\n## {args.calls} sequential calls + {args.rounds} rounds of {CONCURRENT} at once "
        f"({run.calls} calls, {wall_s / 60:.0f} min), {allocator}{extras}\n"
    )
    heap = run.samples[-1].heap is not None
    workers = len(run.samples[-1].workers_mb)
    header = ["phase", "calls", "RSS MB", "anon MB"]
    header += [f"worker {i} MB" for i in range(workers)] + ["llama-server MB"]
    header += ["heap used MB", "heap free MB", "arenas"] if heap else []
    header += ["fds", "threads", "tasks", *[short for _, short in OBJECTS]]
    rows = []
    for s in run.samples:
        row: list[object] = [
            *(s.phase, s.calls, f"{s.rss_mb:.0f}", f"{s.anon_mb:.0f}"),
            *(f"{mb:.0f}" for mb in s.workers_mb),
            f"{s.llm_mb:.0f}",
        ]
        if heap and s.heap is not None:
            row += [
                f"{s.heap['in_use_bytes'] / MB:.0f}",
                f"{s.heap['free_bytes'] / MB:.0f}",
                s.heap["arenas"],
            ]
        row += [s.fds, s.threads, s.tasks, *[s.objects[name] for name, _ in OBJECTS]]
        rows.append(row)
    print(table(rows, header))

    outcomes = ", ".join(f"{n} {status}" for status, n in sorted(run.outcomes.items()))
    print(f"\nCalls: {outcomes}" + (f"; first error: {run.errors[0]}" if run.errors else ""))
    base = run.baseline
    if base is None:
        return
    after = [s for s in run.samples if s.calls >= base.calls]
    last = after[-1]
    summary: list[list[object]] = []

    phases = sorted({s.phase for s in after}, reverse=True)  # sequential first

    def growth(label: str, values: list[tuple[int, float]]) -> None:
        per_phase = []
        for phase in phases:
            points = [v for v, s in zip(values, after, strict=True) if s.phase == phase]
            per_phase.append(f"{slope_per_100(points):+.1f}")
        summary.append(
            [
                label,
                f"{values[0][1]:.0f}",
                f"{values[-1][1]:.0f}",
                f"{max(v for _, v in values):.0f}",
                f"{values[-1][1] - values[0][1]:+.0f}",
                f"{slope_per_100(values):+.1f}",
                " / ".join(per_phase),
            ]
        )

    growth("server RSS MB", [(s.calls, s.rss_mb) for s in after])
    for key in base.counters():
        growth(key, [(s.calls, s.counters()[key]) for s in after])
    print(f"\nAfter warm-up (from call {base.calls} to call {last.calls}):\n")
    print(
        table(
            summary,
            [
                "",
                "at warm-up",
                "last",
                "max",
                "change",
                "per 100 calls",
                f"per 100: {' / '.join(phases)}",
            ],
        )
    )
    if base.types:
        end_types = run.samples[-1].types
        grown = sorted(
            ((end_types.get(k, 0) - base.types.get(k, 0), k) for k in {*end_types, *base.types}),
            reverse=True,
        )[:12]
        print(f"\ngc-tracked objects that grew most (call {base.calls} -> {last.calls}):\n")
        print(
            table(
                [[k, base.types.get(k, 0), end_types.get(k, 0), d] for d, k in grown],
                ["type", "at warm-up", "last", "change"],
            )
        )


async def after_quiet(run: Run, quiet_s: float) -> None:
    """One more sample after ``quiet_s`` without a call: a step that stays
    while calls come (an arena's high-water mark) and goes once they stop
    is not a leak."""
    last = run.samples[-1]
    await asyncio.sleep(quiet_s)  # the quiet itself is what is measured
    quiet = await sample(run.http, run.url, run.pid, "quiet", run.calls, False)
    pairs = [("server RSS MB", last.rss_mb, quiet.rss_mb)]
    for index, (before, after) in enumerate(zip(last.workers_mb, quiet.workers_mb, strict=True)):
        pairs.append((f"worker {index} RSS MB", before, after))
    pairs.append(("llama-server RSS MB", last.llm_mb, quiet.llm_mb))
    if last.heap is not None and quiet.heap is not None:
        in_use = (last.heap["in_use_bytes"] / MB, quiet.heap["in_use_bytes"] / MB)
        pairs.append(("heap in use MB", *in_use))
    rows = [[name, f"{b:.0f}", f"{a:.0f}", f"{a - b:+.0f}"] for name, b, a in pairs]
    print(f"\nAfter {quiet_s:.0f} s without a call:\n")
    print(table(rows, ["", "last sample", "after the quiet", "change"]))


async def closing_notes(http: aiohttp.ClientSession, url: str) -> None:
    """Outbound pacing over the run, the service's own trims, and how much of
    the RSS is free heap glibc kept (given back once, at the end)."""
    async with http.get(url + "/v1/stats") as response:
        pacing = (await response.json())["pacing"]
    print(
        f"\nOutbound frames: {pacing['frames']}, later than 20 ms: {pacing['late_over_20ms']}, "
        f"worst {pacing['max_late_ms']:.0f} ms"
    )
    async with http.get(url + "/debug/memory") as response:
        trims = (await response.json())["trims_after_calls"]
    if trims["trims"]:
        print(
            f"Service trims after calls (--malloc-trim): {trims['trims']}, "
            f"mean {trims['mean_ms']:.1f} ms, max {trims['max_ms']:.1f} ms, in a thread"
        )
    async with http.post(url + "/debug/malloc-trim") as response:
        trim = await response.json()
    if trim["seconds"] is not None:
        print(
            f"One malloc_trim(0) at the end: server RSS {trim['rss_before_bytes'] / MB:.0f}"
            f" -> {trim['rss_after_bytes'] / MB:.0f} MB in {trim['seconds'] * 1000:.0f} ms"
        )


async def tracemalloc_report(http: aiohttp.ClientSession, url: str) -> None:
    async with http.get(url + "/debug/tracemalloc", params={"top": "15"}) as response:
        body = await response.json()
    grew = body["growth_bytes"] / MB
    print(f"\ntracemalloc: Python allocations grew {grew:+.2f} MB since warm-up\n")
    print(
        table(
            [[t["where"], f"{t['size_diff'] / 1024:+.0f}", t["count_diff"]] for t in body["top"]],
            ["allocated at", "KiB change", "blocks change"],
        )
    )


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=1000, help="sequential calls (M)")
    parser.add_argument(
        "--rounds", type=int, default=100, help=f"rounds of {CONCURRENT} concurrent calls (R)"
    )
    parser.add_argument("--every", type=int, default=50, help="sample every K calls")
    parser.add_argument("--warmup", type=int, default=50, help="calls before the baseline")
    parser.add_argument("--settle", type=float, default=1.0, help="seconds before a sample")
    parser.add_argument(
        "--quiet-s",
        type=float,
        default=35.0,
        help="after the calls, this long without one, then a last sample (0 = none): what "
        "the service gives back once idle (Piper's arenas after 30 s)",
    )
    parser.add_argument("--jemalloc", action="store_true", help=f"LD_PRELOAD {JEMALLOC}")
    parser.add_argument(
        "--tracemalloc", type=int, default=0, help="server PYTHONTRACEMALLOC frames (0 = off)"
    )
    parser.add_argument("--server-arg", action="append", default=[], help="serve flag")
    parser.add_argument(
        "--prompt",
        help="each call says this telephone prompt (tests/data/asterisk) instead of a "
        "LibriVox sentence: shorter calls, for the 1,000 to fit in an hour and a half",
    )
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        await client_main(args.client, args.index, args.prompt)
        return

    env: dict[str, str] = {}
    if args.jemalloc:
        env["LD_PRELOAD"] = JEMALLOC
    if args.tracemalloc:
        env["PYTHONTRACEMALLOC"] = str(args.tracemalloc)
    server, url = await start_server(
        # Room for a round's calls while the last round's hang-ups reach the
        # front; one media worker, as at a capacity of 5 calls.
        *("--debug-endpoints", "--workers", "1", "--offers-per-minute", "0"),
        *("--max-calls", str(2 * CONCURRENT)),
        *args.server_arg,
        env=env,
    )
    callers: list[Caller] = []
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, url)
            callers = [await Caller.start(url, i, args.prompt) for i in range(CONCURRENT)]
            run = Run(http, url, server.pid, args, callers)
            started = time.monotonic()
            run.samples.append(await sample(http, url, server.pid, "idle", 0, False))
            await run.sequential(args.calls)
            await run.concurrent(args.rounds)
            wall = time.monotonic() - started
            report(run, wall)
            if args.quiet_s > 0:
                await after_quiet(run, args.quiet_s)
            await closing_notes(http, url)
            if args.tracemalloc and run.baseline is not None:
                await tracemalloc_report(http, url)
    finally:
        await asyncio.gather(*(c.stop() for c in callers), return_exceptions=True)
        server.send_signal(signal.SIGTERM)
        await server.wait()


if __name__ == "__main__":
    asyncio.run(main())
