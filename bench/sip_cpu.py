"""CPU per phone call: the SIP gateway (Kamailio + rtpengine) and the service.

Builds the test lab (voice_agent/testing/sip_lab.py: a network namespace
with the gateway, the service with a scripted LLM, and baresip phones),
places N concurrent calls, each caller speaking a recording in a loop (so
turns, replies and silence all happen), and reads every process's CPU time
from /proc over a window in the middle of the calls. Needs root and the
Debian packages.

    .venv/bin/python bench/sip_cpu.py --calls 4 --window 20
    .venv/bin/python bench/sip_cpu.py --calls 4 --silent     # media only
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
from pathlib import Path

import numpy as np

from voice_agent.audio.resample import StreamResampler
from voice_agent.testing.audio_data import librivox, silence
from voice_agent.testing.scripted_llm import Script, chat_text
from voice_agent.testing.sip_lab import PHONE_RATE, missing, sip_lab
from voice_agent.testing.sip_phone import Phone

TICKS = os.sysconf("SC_CLK_TCK")
GATEWAY_NAMES = {"kamailio", "rtpengine"}


def cpu_by_name(pids: list[int]) -> dict[str, float]:
    """CPU seconds (user + system) of each process, summed by command name."""
    totals: dict[str, float] = {}
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        seconds = (int(fields[11]) + int(fields[12])) / TICKS
        totals[name] = totals.get(name, 0.0) + seconds
    return totals


async def main(calls: int, window_s: float, silent: bool) -> None:
    if (reason := missing()) is not None:
        raise SystemExit(f"cannot run: {reason}")
    turn = np.concatenate((librivox("0930"), silence(6.0)))
    mic = StreamResampler(16_000, PHONE_RATE).process(np.tile(turn, 8))
    if silent:  # the media path alone: no turns, no replies
        mic = np.zeros_like(mic)
    with tempfile.TemporaryDirectory() as workdir:
        # Every bench call comes from the lab's one phone address: the
        # gateway's per-trunk and flood limits are off for the measurement.
        unlimited = {
            "SIP_MAX_CALLS_PER_TRUNK": "0",
            "SIP_CALLS_PER_MINUTE_PER_TRUNK": "0",
            "SIP_FLOOD_REQUESTS": "0",
        }
        async with sip_lab(Path(workdir), gateway_settings=unlimited) as lab:
            for _ in range(calls * 10):
                lab.llm.add(Script(chat_text("It is sunny and warm today, with a light breeze.")))
            phones = [
                Phone(lab, f"phone{i}", mic, sip_port=5070 + 2 * i, control_port=4444 + i)
                for i in range(calls)
            ]
            try:
                # The same window with no call: what the processes cost idle.
                idle_start = cpu_by_name(lab.namespace.pids())
                await asyncio.sleep(window_s)
                idle = cpu_by_name(lab.namespace.pids())
                for phone in phones:
                    await phone.start()
                    await phone.dial()
                for phone in phones:
                    await phone.event("CALL_ESTABLISHED", 20)
                await asyncio.sleep(5)  # past set-up: the steady state of a call
                before = cpu_by_name(lab.namespace.pids())
                await asyncio.sleep(window_s)
                after = cpu_by_name(lab.namespace.pids())
            finally:
                for phone in phones:
                    await phone.stop()
    used = {name: after.get(name, 0.0) - before.get(name, 0.0) for name in after}
    baseline = {name: idle.get(name, 0.0) - idle_start.get(name, 0.0) for name in idle}
    gateway = sum(v for k, v in used.items() if k in GATEWAY_NAMES)
    phones_cpu = used.get("baresip", 0.0)
    service = sum(v for k, v in used.items() if k not in GATEWAY_NAMES | {"baresip"})
    print(f"{calls} concurrent calls, {window_s:g} s window, {lab.llm.requests.__len__()} replies")
    idle_gateway = sum(v for k, v in baseline.items() if k in GATEWAY_NAMES)
    idle_service = sum(v for k, v in baseline.items() if k not in GATEWAY_NAMES)
    print("| part | CPU % of one core: idle | with the calls | per call, idle taken off |")
    print("|---|---|---|---|")
    for part, seconds, base in [
        ("gateway (kamailio + rtpengine)", gateway, idle_gateway),
        ("service", service, idle_service),
    ]:
        share, idle_share = 100 * seconds / window_s, 100 * base / window_s
        print(f"| {part} | {idle_share:.1f} | {share:.1f} | {(share - idle_share) / calls:.2f} |")
    print(f"| (the phones, baresip) | {100 * phones_cpu / window_s:.1f} | |")
    for name, seconds in sorted(used.items(), key=lambda item: -item[1]):
        print(f"    {name}: {100 * seconds / window_s:.1f} %")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--window", type=float, default=20.0)
    parser.add_argument("--silent", action="store_true", help="callers say nothing")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.window, args.silent))
