"""One latency lever against its baseline, turn by turn, in one run.

These 2-core machines have slow and fast spells lasting minutes: the same
code's p50 moved from 756 to 994 ms between two 12-turn runs of
bench/latency.py a quarter of an hour apart. Alternating whole runs of each setting
needs many of them to see a 40 ms effect. This starts two servers, the
baseline (``--server-arg`` flags) and the variant (the same plus
``--versus`` flags), keeps one call open to each, and alternates single
turns between them: turn k of both arms speaks the same clip, back to back,
which of the two goes first alternating. Each pair shares the host's spell;
the pairs' ratios (variant / baseline, client-measured voice-to-voice) are
the result, summarised by their median and a bootstrap interval.

The idle server's call stays connected (its audio flows, as a quiet caller's
does) while the other answers, the same for both arms.

    .venv/bin/python bench/latency_ab.py --versus=--stt-early-ms=60 --turns 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import sys
from pathlib import Path

import aiohttp

from voice_agent.rtc.call import restrict_host_addresses
from voice_agent.testing.figures import percentile, table
from voice_agent.testing.serving import start_server, wait_ready

# ``python bench/<script>.py`` puts bench/ on the path, not the checkout's
# root, which the bench.* imports below are found from.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.latency import CLIPS, DURATIONS, STAGES, Turn, connected, spoken_turn

ARMS = ("baseline", "variant")


def bootstrap_median(ratios: list[float], rounds: int = 2000) -> tuple[float, float]:
    """A 90 % interval for the median ratio (resampling the pairs)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(rounds))
    return percentile(medians, 5), percentile(medians, 95)


def arm_summary(turns: list[Turn]) -> dict[str, float]:
    answered = [t for t in turns if t.status == "completed" and t.client_ms is not None]
    summary: dict[str, float] = {}
    client = [t.client_ms for t in answered if t.client_ms is not None]
    if client:
        summary["client voice-to-voice p50"] = percentile(client, 50)
        summary["client voice-to-voice p95"] = percentile(client, 95)
    for key, label in [*STAGES, *DURATIONS]:
        values = [t.server[key] for t in answered if key in t.server]
        if values:
            summary[f"server: {label} p50"] = percentile(values, 50)
    return summary


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--versus", action="append", default=[], help="the variant's flag")
    parser.add_argument(
        "--baseline-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the baseline's server only (a lever that is an "
        "environment change: the baseline runs the old environment)",
    )
    parser.add_argument(
        "--versus-env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable for the variant's server only",
    )
    parser.add_argument("--server-arg", action="append", default=[], help="both arms' flag")
    parser.add_argument("--turns", type=int, default=20, help="turns per arm")
    parser.add_argument("--gap", type=float, default=0.5, help="seconds between turns")
    args = parser.parse_args()
    if not (args.versus or args.versus_env or args.baseline_env):
        parser.error("nothing differs: give --versus, --versus-env or --baseline-env")

    restrict_host_addresses(["127.0.0.1"])
    flags = {"baseline": args.server_arg, "variant": [*args.server_arg, *args.versus]}
    envs = {
        "baseline": dict(pair.split("=", 1) for pair in args.baseline_env),
        "variant": dict(pair.split("=", 1) for pair in args.versus_env),
    }
    servers = {arm: await start_server(*flags[arm], env=envs[arm]) for arm in ARMS}
    turns: dict[str, list[Turn]] = {arm: [] for arm in ARMS}
    try:
        async with aiohttp.ClientSession() as http:
            for _, url in servers.values():
                await wait_ready(http, url)
            calls = {arm: await connected(servers[arm][1], http) for arm in ARMS}
            # A warm-up turn each: first-use allocations are not the lever's.
            for arm in ARMS:
                await spoken_turn(calls[arm][0], 0, CLIPS[0], args.gap)
            for k in range(args.turns):
                clip = CLIPS[k % len(CLIPS)]
                for arm in ARMS if k % 2 == 0 else ARMS[::-1]:
                    turns[arm].append(await spoken_turn(calls[arm][0], 0, clip, args.gap))
            for client, _ in calls.values():
                await client.hangup(http)
    finally:
        for process, _ in servers.values():
            process.send_signal(signal.SIGTERM)
        for process, _ in servers.values():
            await process.wait()

    differs = [*args.versus, *args.versus_env, *(f"(baseline: {e})" for e in args.baseline_env)]
    print(f"\n## {args.turns} turn pairs; variant: {' '.join(differs)}\n")
    rows = [
        [
            k,
            base.clip,
            f"{base.client_ms:.0f}" if base.client_ms else base.status,
            f"{var.client_ms:.0f}" if var.client_ms else var.status,
            f"{var.client_ms / base.client_ms:.2f}" if base.client_ms and var.client_ms else "-",
        ]
        for k, (base, var) in enumerate(zip(turns["baseline"], turns["variant"], strict=True))
    ]
    print(table(rows, ["pair", "clip", "baseline v2v ms", "variant v2v ms", "ratio"]))
    summaries = {arm: arm_summary(turns[arm]) for arm in ARMS}
    keys = [k for k in summaries["baseline"] if k in summaries["variant"]]
    print(
        "\n"
        + table(
            [
                [
                    key,
                    f"{summaries['baseline'][key]:.0f}",
                    f"{summaries['variant'][key]:.0f}",
                    f"{summaries['variant'][key] / summaries['baseline'][key]:.2f}"
                    if summaries["baseline"][key]
                    else "-",
                ]
                for key in keys
            ],
            ["ms", "baseline", "variant", "ratio"],
        )
    )
    ratios = [
        var.client_ms / base.client_ms
        for base, var in zip(turns["baseline"], turns["variant"], strict=True)
        if base.client_ms and var.client_ms and base.status == var.status == "completed"
    ]
    if ratios:
        low, high = bootstrap_median(ratios)
        median = statistics.median(ratios)
        print(
            f"\npaired ratio variant / baseline: median {median:.3f} "
            f"(90 % interval {low:.3f}-{high:.3f}), {sum(r < 1 for r in ratios)} "
            f"of {len(ratios)} pairs faster with the variant"
        )
        print(json.dumps({"pairs": len(ratios), "median_ratio": median, "low": low, "high": high}))


if __name__ == "__main__":
    asyncio.run(main())
