"""The loop-health monitor's own cost, and asyncio debug mode's for comparison.

Idle: an event loop with nothing to do for --seconds, bare and with the
monitor (its default heartbeat every 100 ms, and every 50 ms; the watchdog
thread); the process's CPU time (all threads) over wall time, as % of one core.

Busy: --steps task steps (tasks that await ``asyncio.sleep(0)`` in a loop),
bare, with the monitor, and in asyncio debug mode (what
``slow_callback_duration`` needs): microseconds per step.

    .venv/bin/python bench/loop_health.py
    .venv/bin/python bench/loop_health.py --seconds 60 --steps 500000
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import time

from voice_agent.loop_health import HEARTBEAT_INTERVAL_S, LoopHealthMonitor
from voice_agent.testing.figures import table

TASKS = 100


async def idle(seconds: float, interval_s: float | None) -> tuple[float, float]:
    """CPU seconds and wall seconds of an idle loop (monitored when an
    interval is given)."""
    monitor = LoopHealthMonitor(interval_s=interval_s) if interval_s else None
    if monitor is not None:
        monitor.start()
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        await asyncio.sleep(seconds)
        return time.process_time() - cpu, time.perf_counter() - wall
    finally:
        if monitor is not None:
            monitor.stop()


async def churn(steps: int, monitored: bool) -> float:
    """Seconds for ``steps`` task steps spread over TASKS tasks."""
    monitor = LoopHealthMonitor() if monitored else None
    if monitor is not None:
        monitor.start()

    async def worker(count: int) -> None:
        for _ in range(count):
            await asyncio.sleep(0)

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker(steps // TASKS) for _ in range(TASKS)))
        return time.perf_counter() - started
    finally:
        if monitor is not None:
            monitor.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=20.0, help="idle time per variant")
    parser.add_argument("--steps", type=int, default=200_000, help="task steps per variant")
    parser.add_argument("--repeats", type=int, default=3, help="busy runs per variant")
    args = parser.parse_args()
    # Stalls the host's other load causes are reported (by debug mode and by
    # the monitor itself); they are not what is measured here.
    for noisy in ("asyncio", "voice_agent.loop_health"):
        logging.getLogger(noisy).setLevel(logging.ERROR)

    rows: list[list[object]] = []
    for label, interval_s in (
        ("bare loop", None),
        ("monitor, heartbeat 100 ms (default)", HEARTBEAT_INTERVAL_S),
        ("monitor, heartbeat 50 ms", 0.05),
    ):
        cpu, wall = asyncio.run(idle(args.seconds, interval_s))
        rows.append([label, f"{wall:.1f}", f"{cpu * 1000:.1f}", f"{100 * cpu / wall:.3f}"])
    print(f"Idle loop, {args.seconds:.0f} s each")
    print(table(rows, ["variant", "wall s", "CPU ms", "CPU % of a core"]))

    variants = (
        ("bare loop", False, False),
        ("with the monitor", True, False),
        ("asyncio debug mode", False, True),
    )
    best: dict[str, float] = {}
    for _ in range(args.repeats):  # interleaved, best of each: the host's other load is noise
        for label, monitored, debug in variants:
            seconds = asyncio.run(churn(args.steps, monitored), debug=debug)
            best[label] = min(best.get(label, math.inf), seconds / args.steps * 1e6)
    base = best["bare loop"]
    rows = [[label, f"{best[label]:.2f}", f"{best[label] / base:.2f}x"] for label, *_ in variants]
    print(f"\nBusy loop, {args.steps} task steps each, best of {args.repeats}")
    print(table(rows, ["variant", "us per step", "vs bare"]))


if __name__ == "__main__":
    main()
