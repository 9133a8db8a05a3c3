"""How many cores this process may use, and the defaults derived from it.

The count honours the CPU affinity mask (taskset, cpusets) and a cgroup v2
CPU quota (a container's or pod's CPU limit), so a service limited to 2
cores of a 64-core host sizes itself for 2.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

# Calls one core carries, measured with bench/load.py on the embedded
# models: on 2 cores, 5 callers complete every turn with 0-59 of ~15,000
# frames late (voice-to-voice p50 1.7-2.3 s; see the README's load table).
CALLS_PER_CORE = 2.5


def available_cores() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def _cgroup_quota() -> float | None:
    """cgroup v2 cpu.max ("max 100000" or "200000 100000"), in cores."""
    try:
        text = Path("/sys/fs/cgroup/cpu.max").read_text().split()
    except OSError:
        return None
    if len(text) != 2 or text[0] == "max":
        return None
    try:
        return int(text[0]) / int(text[1])
    except (ValueError, ZeroDivisionError):
        return None


def default_max_calls() -> int:
    return max(1, math.floor(available_cores() * CALLS_PER_CORE))


def default_threads(cap: int) -> int:
    """Threads for one model's inference: every core up to ``cap`` (small
    models stop scaling past a few threads; more only contend)."""
    return max(1, min(available_cores(), cap))
