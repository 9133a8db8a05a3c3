"""What bench/soak.py samples of the server, from outside (/proc: RSS of
the server, of each media worker and of the llama-server child; fds,
threads) and inside (``/debug/memory``, the front's and each worker's:
asyncio tasks, live aiortc objects by type, glibc's heap), and the growth
per 100 calls fitted to those samples."""

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
    rss_mb: float  # the server's process (the front, with media workers)
    anon_mb: float  # of rss_mb: heap and stacks, not mapped files (code, weights)
    llm_mb: float  # its other children: the embedded llama-server
    workers_mb: list[float]  # each media worker's RSS, by index
    # Summed over the server's process and its media workers:
    fds: int
    threads: int
    tasks: int
    objects: dict[str, int]
    heap: dict[str, int] | None  # the server's process
    types: dict[str, int] = field(default_factory=dict)  # every process's, summed

    def counters(self) -> dict[str, float]:
        values: dict[str, float] = {"server anon RSS MB": self.anon_mb}
        for index, mb in enumerate(self.workers_mb):
            values[f"worker {index} RSS MB"] = mb
        values.update(
            {
                "llama-server RSS MB": self.llm_mb,
                "fds": self.fds,
                "threads": self.threads,
                "asyncio tasks": self.tasks,
            }
        )
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
    workers = inside.get("workers", [])
    for worker in workers:
        if "error" in worker:
            raise RuntimeError(f"media worker {worker['index']}: {worker['error']}")
    worker_pids = [int(w["pid"]) for w in workers]
    others = [c for c in children(pid) if c not in worker_pids]
    counted = [inside, *workers]
    objects = {name: sum(c["objects"][name] for c in counted) for name in inside["objects"]}
    summed_types: dict[str, int] = {}
    for body in counted:
        for name, count in body.get("types", {}).items():
            summed_types[name] = summed_types.get(name, 0) + count
    return Sample(
        phase=phase,
        calls=calls,
        rss_mb=proc_status(pid, "VmRSS") / 1024,
        anon_mb=proc_status(pid, "RssAnon") / 1024,
        llm_mb=sum(proc_status(c, "VmRSS") for c in others) / 1024,
        workers_mb=[proc_status(w, "VmRSS") / 1024 for w in worker_pids],
        fds=sum(len(os.listdir(f"/proc/{p}/fd")) for p in [pid, *worker_pids]),
        threads=sum(proc_status(p, "Threads") for p in [pid, *worker_pids]),
        tasks=sum(c["tasks"] for c in counted),
        objects=objects,
        heap=inside["heap"],
        types=summed_types,
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
