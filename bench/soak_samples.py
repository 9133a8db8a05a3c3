"""What bench/soak.py samples of the server, from outside (/proc: RSS, its
children's RSS, fds, threads) and inside (``/debug/memory``: asyncio tasks,
live aiortc objects by type, glibc's heap), and the growth per 100 calls
fitted to those samples."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

MB = 1024 * 1024
# Table columns for /debug/memory's live objects, with short headers.
OBJECTS = [
    ("RTCPeerConnection", "pc"),
    ("RTCIceTransport", "ice"),
    ("aioice.Connection", "aioice"),
    ("RTCDtlsTransport", "dtls"),
    ("RTCSctpTransport", "sctp"),
    ("RTCDataChannel", "dc"),
    ("RTCRtpSender", "sender"),
    ("RTCRtpReceiver", "recv"),
    ("MediaStreamTrack", "tracks"),
    ("Call", "Call"),
    ("VoiceSession", "session"),
    ("Reply", "reply"),
]


def proc_status(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(p) for p in (task / "children").read_text().split()]
    return found


@dataclass
class Sample:
    phase: str
    calls: int
    rss_mb: float
    anon_mb: float  # of rss_mb: heap and stacks, not mapped files (code, weights)
    child_mb: float
    fds: int
    threads: int
    tasks: int
    objects: dict[str, int]
    heap: dict[str, int] | None
    types: dict[str, int] = field(default_factory=dict)

    def counters(self) -> dict[str, float]:
        values: dict[str, float] = {
            "server anon RSS MB": self.anon_mb,
            "child RSS MB": self.child_mb,
            "fds": self.fds,
            "threads": self.threads,
            "asyncio tasks": self.tasks,
        }
        if self.heap is not None:
            values["heap in use MB"] = self.heap["in_use_bytes"] / MB
            values["heap free MB"] = self.heap["free_bytes"] / MB
            values["arenas"] = self.heap["arenas"]
        values.update(self.objects)
        return values


async def sample(
    http: aiohttp.ClientSession, url: str, pid: int, phase: str, calls: int, types: bool
) -> Sample:
    async with http.get(url + "/debug/memory", params={"types": "1"} if types else {}) as r:
        inside = await r.json()
    return Sample(
        phase=phase,
        calls=calls,
        rss_mb=proc_status(pid, "VmRSS") / 1024,
        anon_mb=proc_status(pid, "RssAnon") / 1024,
        child_mb=sum(proc_status(c, "VmRSS") for c in children(pid)) / 1024,
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=proc_status(pid, "Threads"),
        tasks=inside["tasks"],
        objects=inside["objects"],
        heap=inside["heap"],
        types=inside.get("types", {}),
    )


def slope_per_100(points: list[tuple[int, float]]) -> float:
    """Least-squares growth of a value per 100 calls."""
    if len(points) < 2:
        return float("nan")
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    cov = sum((x - mean_x) * (y - mean_y) for x, y in points)
    return 100 * cov / var if var else float("nan")
