"""What the process holds (tasks, fds, threads, calls, peer connections),
counted before and after a test's bad input to show nothing was left behind."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from dataclasses import dataclass

from aiortc import RTCPeerConnection

from voice_agent.memory import TRIMMER
from voice_agent.rtc.call import Call


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def own_threads() -> int:
    """Threads, not counting the loop's default executor: its workers are
    started on demand, reused and bounded, so more of them is no leak."""
    return sum(not t.name.startswith("asyncio_") for t in threading.enumerate())


@dataclass(frozen=True)
class Held:
    tasks: int
    fds: int
    threads: int
    calls: int
    peer_connections: int


def counted_tasks() -> set[asyncio.Task[object]]:
    """The loop's tasks but those serving a kept-alive HTTP connection: one
    per socket of the client's keep-alive pool, which may settle on a
    connection more (the fds' slack below), and is no leak."""
    return {
        task
        for task in asyncio.all_tasks()
        if getattr(task.get_coro(), "__qualname__", "") != "RequestHandler.start"
    }


def held() -> Held:
    gc.collect()
    objects = gc.get_objects()
    return Held(
        tasks=len(counted_tasks()),
        fds=open_fds(),
        threads=own_threads(),
        calls=sum(isinstance(o, Call) for o in objects),
        peer_connections=sum(isinstance(o, RTCPeerConnection) for o in objects),
    )


async def assert_nothing_left(before: Held, fd_slack: int = 2) -> None:
    """Nothing more is held than ``before`` (the client's keep-alive pool may
    settle on ``fd_slack`` more sockets), once the heap trim that a call's
    end asks for (a process-wide task, voice_agent/memory.py) is done."""
    await TRIMMER.wait()
    after = held()
    assert after.tasks <= before.tasks, (before, after, counted_tasks())
    assert after.fds <= before.fds + fd_slack, (before, after)
    assert after.threads <= before.threads, (before, after, threading.enumerate())
    assert after.calls == before.calls, (before, after)
    assert after.peer_connections == before.peer_connections, (before, after)
