"""Start-up: from launching ``voice-agent serve`` to ready for a call.

Each run launches ``voice-agent serve`` as ``make run`` does (its defaults,
a free port) in a process of its own, polls ``/healthz`` then ``/readyz``
every ``--poll-ms`` until each answers 200, and times both from the launch,
with the steps the server's JSON log names (its ``ts``, from the launch):
listening, STT and TTS loaded, llama-server ready, the engine ready (warm-up
done), the media workers ready. At ready it sums the memory and CPU time
of the server's process tree, found through /proc by parent pid (the front,
the media workers, llama-server), and the CPU time the machine's other
processes had meanwhile (on a busy machine, the wait apart from the work).
With ``--calls N`` it then makes N calls of ``--call-turns`` turns each
(bench/latency.py's real client and recordings, one after another), leaves
the server idle for ``--idle-s`` and sums the memory again: what an idle
service holds once it has been used, not only at start. Then SIGTERM, and a
wait: a process of the tree still there (killed) or the server's runtime
folder left is reported.

Cold runs (``--cold``, one by default) point the derived-artefact cache
(``VOICE_AGENT_CACHE``, whisper_weights.cache_root) at a fresh empty
temporary folder, so the server rebuilds all it keeps there: Whisper base's
joined ``model.bin``, the Q8_0 LLM weights, the ONNX decoder graphs. Each is
made offline from the installed packages' files, which stay as they are, as
does the llama-server binary (``make``'s build); nothing is downloaded. The
warm runs then reuse that folder, removed at the end; with ``--cold 0`` they
use the user's cache, never written by a cold run. "Cold" is the cache only:
the packages' files may be in the page cache.

    .venv/bin/python bench/startup.py             # 1 cold run, then 3 warm
    .venv/bin/python bench/startup.py --cold 0 --runs 5
    .venv/bin/python bench/startup.py --cold 0 --python /tmp/base/bin/python  # beside another build
    .venv/bin/python bench/startup.py --cold 0 --runs 2 --calls 3   # + idle after 3 calls
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from voice_agent.rtc.call import restrict_host_addresses
from voice_agent.testing.figures import table
from voice_agent.testing.ports import free_port

# ``python bench/startup.py`` puts bench/ on the path, not the checkout's root.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.latency import one_call  # the calls of --calls

VOICE_AGENT = Path(sys.executable).with_name("voice-agent")
# Each step's column, and the message of the front's log line that ends it.
LOGGED = {
    "listening": "listening",
    "STT": "stt model loaded",
    "TTS": "tts voice loaded",
    "llama-server": "embedded llama.cpp server ready",
    "engine": "engine ready",
    "workers": "media workers ready",
}
MARKS = ("/healthz 200", *LOGGED, "/readyz 200")
# What a cold cache makes the server build, by the log line that says so.
BUILDS = {"assembling whisper base weights": "whisper", "converting the LLM weights": "q8_0"}
ROLES = ("front", "llama-server", "workers", "other")
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Run:
    name: str
    at: dict[str, float] = field(default_factory=lambda: {"launch": 0.0})  # seconds, by MARKS
    # role: [processes, RSS kB, PSS kB, CPU ticks (user + system) until ready]
    memory: dict[str, list[int]] = field(default_factory=dict)
    after: dict[str, list[int]] = field(default_factory=dict)  # the same after calls and idle
    turns: list[str] = field(default_factory=list)  # each call turn's status
    busy_s: float = 0.0  # the whole machine's CPU time from the launch to ready
    warnings: int = 0
    built: list[str] = field(default_factory=list)
    left_behind: list[str] = field(default_factory=list)


def processes() -> dict[int, list[str]]:
    """Every process's /proc/PID/stat after its name: [1] its parent pid,
    [11] and [12] its user and system CPU ticks, [19] its start time."""
    found = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:  # the name, in parentheses, may hold spaces and ")"
            found[int(entry.name)] = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue  # gone meanwhile
    return found


def busy_ticks() -> int:
    """CPU time all processes have had, in ticks: user, nice, system, irq, softirq, steal."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(fields) - fields[3] - fields[4]  # less idle and iowait


def sample(memory: dict[str, list[int]], root: int) -> dict[int, str]:
    """The memory and CPU time of ``root`` and its descendants into
    ``memory``; those processes, with their start times."""
    every, found, stack = processes(), dict[int, str](), [root]
    while stack:
        pid = stack.pop()
        found[pid] = every[pid][19] if pid in every else ""
        stack.extend(child for child, stat in every.items() if int(stat[1]) == pid)
    for pid in found:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/status").read_text().split()
            rollup = Path(f"/proc/{pid}/smaps_rollup").read_text().split()
            kb = [int(status[status.index("VmRSS:") + 1]), int(rollup[rollup.index("Pss:") + 1])]
            ticks = int(every[pid][11]) + int(every[pid][12])
        except (OSError, KeyError, ValueError):
            continue  # exited meanwhile
        name = "front" if pid == root else "other"
        if Path(argv[0].decode()).name == "llama-server":
            name = "llama-server"
        elif b"voice_agent.server.worker" in argv:
            name = "workers"
        totals = memory.get(name, [0, 0, 0, 0])
        memory[name] = [a + b for a, b in zip(totals, [1, *kb, ticks], strict=True)]
    return found


def read_log(run: Run, lines: list[bytes], launched: float) -> None:
    for line in lines:
        try:
            entry: dict[str, Any] = json.loads(line)
            msg = entry.get("msg")
        except (ValueError, AttributeError):
            continue  # not a log line
        for column, message in LOGGED.items():
            if msg == message and "worker" not in entry and column not in run.at:
                run.at[column] = entry["ts"] - launched
        run.warnings += entry.get("level") in ("warning", "error", "critical")
        if msg in BUILDS:
            run.built.append(BUILDS[msg])
        if msg == "worker engine ready" and Path(entry["speech"]).parent.exists():
            run.left_behind.append(str(Path(entry["speech"]).parent))  # its runtime folder


async def until_200(
    http: aiohttp.ClientSession, url: str, process: asyncio.subprocess.Process, poll_s: float
) -> float:
    """time.monotonic() when ``url`` first answers 200."""
    while True:
        if process.returncode is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before {url}")
        try:
            async with http.get(url) as response:
                if response.status == 200:
                    return time.monotonic()
        except aiohttp.ClientError:
            pass  # not listening yet
        await asyncio.sleep(poll_s)  # a benchmark's poll: the server is not in this process


async def collect(stream: asyncio.StreamReader | None, lines: list[bytes]) -> None:
    assert stream is not None
    async for line in stream:
        lines.append(line)


async def one_run(
    name: str, cache: Path | None, args: argparse.Namespace, server: list[str | Path]
) -> Run:
    run, port, lines = Run(name), free_port(), list[bytes]()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if cache is not None:
        env["VOICE_AGENT_CACHE"] = str(cache)
    command = [*server, "serve", "--port", str(port), *args.server_arg]
    pipe = asyncio.subprocess.PIPE
    launched_wall, launched, busy = time.time(), time.monotonic(), busy_ticks()
    # Another build runs in its interpreter's directory: an older front
    # starts its media workers with the working directory first on their
    # path, where this checkout's voice_agent/ would go ahead of its own.
    cwd = None if server == [VOICE_AGENT] else Path(server[0]).parent
    process = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=pipe, stderr=pipe, cwd=cwd
    )
    readers = [asyncio.create_task(collect(s, lines)) for s in (process.stdout, process.stderr)]
    url, found = f"http://127.0.0.1:{port}", dict[int, str]()
    try:
        timeout = aiohttp.ClientTimeout(total=5)
        async with aiohttp.ClientSession(timeout=timeout) as http, asyncio.timeout(args.timeout):
            for path in ("/healthz", "/readyz"):
                ready = await until_200(http, url + path, process, args.poll_ms / 1000)
                run.at[f"{path} 200"] = ready - launched
        run.busy_s = (busy_ticks() - busy) / TICK
        found = sample(run.memory, process.pid)
        if args.calls:
            await used_then_idle(run, url, args)
            found |= sample(run.after, process.pid)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), args.stop_timeout)
        except TimeoutError:
            run.left_behind.append(f"pid {process.pid} (killed after {args.stop_timeout} s)")
            process.kill()
            await process.wait()
        await asyncio.gather(*readers)
    alive = processes()
    for pid, started in found.items():
        if pid != process.pid and pid in alive and alive[pid][19] == started:
            run.left_behind.append(f"pid {pid} (killed)")
            os.kill(pid, signal.SIGKILL)
    read_log(run, lines, launched_wall)
    return run


async def used_then_idle(run: Run, url: str, args: argparse.Namespace) -> None:
    """``args.calls`` calls one after another, then ``args.idle_s`` of quiet."""
    async with aiohttp.ClientSession() as http:
        for index in range(args.calls):
            turns, _ = await one_call(url, http, index, args.call_turns, 0.5)
            run.turns += [t.status for t in turns]
    await asyncio.sleep(args.idle_s)


def seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(runs: list[Run]) -> None:
    print("\n## Start-up, seconds from the launch\n")
    rows: list[list[object]] = [
        [r.name, *(seconds(r.at.get(m)) for m in MARKS), ", ".join(r.built) or "-", r.warnings]
        for r in runs
    ]
    print(table(rows, ["run", *MARKS, "built", "warnings"]))
    print("\n## At ready: each role's RSS MB, CPU s (processes); the sums; others' CPU s\n")
    rows = []
    for r in runs:
        m = r.memory
        cells = [
            f"{m[k][1] >> 10}, {m[k][3] / TICK:.2f} ({m[k][0]})" if k in m else "-" for k in ROLES
        ]
        rss, pss, cpu = (sum(v[i] for v in m.values()) for i in (1, 2, 3))
        sums = [rss >> 10, pss >> 10, seconds(cpu / TICK), seconds(r.busy_s - cpu / TICK)]
        rows.append([r.name, *cells, *sums])
    print(table(rows, ["run", *ROLES, "RSS", "PSS", "CPU s", "others' CPU s"]))
    used = [r for r in runs if r.after]
    if used:
        print(
            "\n## After the calls and the idle spell: each role's RSS MB (processes); "
            "the sums; the turns\n"
        )
        rows = []
        for r in used:
            idle = r.after
            cells = [f"{idle[k][1] >> 10} ({idle[k][0]})" if k in idle else "-" for k in ROLES]
            rss, pss = (sum(v[i] for v in idle.values()) >> 10 for i in (1, 2))
            done = sum(status == "completed" for status in r.turns)
            rows.append([r.name, *cells, rss, pss, f"{done} of {len(r.turns)} completed"])
        print(table(rows, ["run", *ROLES, "RSS", "PSS", "turns"]))
    print("\n## Where the time goes: each step's seconds (medians, this build)\n")
    groups = [
        [r for r in runs if r.name.startswith(kind) and "(" not in r.name]
        for kind in ("cold", "warm")
    ]
    rows = []
    for a, b in itertools.pairwise(("launch", *MARKS[1:])):
        spans = [[r.at[b] - r.at[a] for r in g if a in r.at and b in r.at] for g in groups]
        rows.append([f"{a} -> {b}", *(seconds(statistics.median(x)) if x else "-" for x in spans)])
    print(table(rows, ["step", "cold", "warm"]))
    for r in runs:
        for leftover in r.left_behind:
            print(f"left behind by {r.name}: {leftover}")


def machine() -> str:
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((x.split(":", 1)[1].strip() for x in info if x.startswith("model name")), "?")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return f"{time.strftime('%Y-%m-%d %H:%M %Z')}, {cpu}, {os.cpu_count()} CPUs, load {load}"


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="warm runs")
    parser.add_argument("--cold", type=int, default=1, help="cold runs first, each a fresh cache")
    parser.add_argument("--poll-ms", type=float, default=20.0, help="/healthz, /readyz poll")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds to ready, at most")
    parser.add_argument("--stop-timeout", type=float, default=60.0, help="seconds to exit")
    parser.add_argument("--server-arg", action="append", default=[], help="serve flag")
    parser.add_argument("--calls", type=int, default=0, help="calls after ready, one by one")
    parser.add_argument("--call-turns", type=int, default=2, help="turns of each call")
    parser.add_argument("--idle-s", type=float, default=40.0, help="quiet after the calls")
    parser.add_argument(
        "--python",
        action="append",
        default=[],
        help="also run `PYTHON -m voice_agent serve` (another build's interpreter), "
        "each warm run beside this build's",
    )
    args = parser.parse_args()
    if args.calls:
        restrict_host_addresses(["127.0.0.1"])  # the callers and the server on loopback
    builds: list[tuple[str, list[str | Path]]] = [("", [VOICE_AGENT])]
    # -P: that interpreter imports its own build, not the voice_agent/ here.
    builds += [(f" ({p})", [p, "-P", "-m", "voice_agent"]) for p in args.python]
    print(machine())
    runs: list[Run] = []
    cache: Path | None = None
    try:
        for i in range(args.cold):
            if cache is not None:
                shutil.rmtree(cache)
            cache = Path(tempfile.mkdtemp(prefix="voice-agent-startup-cache-"))
            runs.append(await one_run(f"cold {i + 1}", cache, args, builds[0][1]))
        if cache is not None:
            made = sorted(p for p in cache.rglob("*") if p.is_file())
            sizes = [f"{p.relative_to(cache)} {p.stat().st_size >> 20} MB" for p in made]
            print("built in the fresh cache:", ", ".join(sizes))
        for i in range(args.runs):
            for label, server in builds:
                runs.append(await one_run(f"warm {i + 1}{label}", cache, args, server))
    finally:
        if cache is not None:
            shutil.rmtree(cache, ignore_errors=True)
    report(runs)
    print("\n" + machine())


if __name__ == "__main__":
    asyncio.run(main())
