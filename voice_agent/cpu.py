"""How many cores this process may use, and the defaults derived from it.

The count honours the CPU affinity mask (taskset, cpusets) and a cgroup v2
CPU quota (a container's or pod's CPU limit), so a service limited to 2
cores of a 64-core host sizes itself for 2.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)

# Calls one core carries where no turn's cost could be measured
# (voice_agent/capacity.py): on 2 cores with the embedded models, 5 callers
# complete every turn with 0-59 of ~15,000 frames late (bench/load.py).
CALLS_PER_CORE = 2.5
# Calls one media worker process carries: its Python runs every packet of
# its calls under one GIL. On 2 cores (bench/RESULTS.md, "One media worker
# or two"), five calls in one worker sent every frame on time; ten in one
# sent 53-66 of ~17,000-19,000 frames 20-40 ms late, ten in two none.
CALLS_PER_MEDIA_WORKER = 5


def cpu_flags() -> frozenset[str]:
    """This CPU's feature flags as Linux lists them (``avx2``,
    ``avx512_vnni``, ...); empty where /proc/cpuinfo cannot be read."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def available_cores() -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


def media_workers_for(calls: int, cores: int) -> int:
    """Media worker processes for a capacity of ``calls`` on ``cores``: one
    for every CALLS_PER_MEDIA_WORKER calls, at most one a core; none (the
    front runs everything) on one core, where a second process only adds
    its memory."""
    if cores <= 1:
        return 0
    return max(1, min(cores, math.ceil(calls / CALLS_PER_MEDIA_WORKER)))


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


def default_parallel(threads_per_job: int) -> int:
    """Jobs one model runs at once: as many as the cores hold side by side."""
    return max(1, available_cores() // max(1, threads_per_job))


def limit_blas_threads(threads: int) -> list[str]:
    """Caps the BLAS libraries loaded in this process (numpy's OpenBLAS) at
    ``threads``; returns the ones capped. OpenBLAS's worker threads spin for
    about 0.1 s after each call before they sleep: a numpy matmul on the
    media path or in Whisper's feature extraction leaves a core busy with
    nothing while the models wait for it (measured: Whisper's encoder
    60 ms slower right after its features). An OpenBLAS loaded later (SciPy's
    own, with NeMo or Coqui) reads the environment when it loads, so that is
    set too. 0 leaves the libraries alone."""
    if threads <= 0:
        return []
    from threadpoolctl import threadpool_info, threadpool_limits

    os.environ["OPENBLAS_NUM_THREADS"] = str(threads)
    threadpool_limits(limits=threads, user_api="blas")
    return [str(lib["filepath"]) for lib in threadpool_info() if lib["user_api"] == "blas"]


# Niceness added to model inference threads (process-wide, set once at
# start-up). On Linux niceness is per thread and inherited by the threads a
# thread creates, so a model loaded in a niced thread computes in niced
# threads: the event loop (media pacing, signaling) preempts inference.
_inference_nice = 0


def set_inference_nice(nice: int) -> None:
    global _inference_nice
    _inference_nice = nice


def lower_this_thread() -> None:
    """Give the calling thread the inference niceness (a thread pool's initializer)."""
    if _inference_nice <= 0:
        return
    try:
        # Linux: PRIO_PROCESS with a thread id changes that thread only. The
        # target is relative to the main thread's, and never lowered again
        # for a thread that inherited it already.
        tid = threading.get_native_id()
        target = os.getpriority(os.PRIO_PROCESS, os.getpid()) + _inference_nice
        if os.getpriority(os.PRIO_PROCESS, tid) < target:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, target))
    except OSError as exc:  # a sandbox may refuse it; inference still works
        log.warning("cannot lower inference thread priority: %s", exc)


def call_at_idle_priority(func: Callable[[], T]) -> T:
    """``func()`` in a thread of its own switched to SCHED_IDLE, waited for.
    A model loaded there computes in threads that inherit the policy (on
    Linux a scheduling policy is per thread, like niceness): they run only
    on CPU nothing else wants, while the caller's thread keeps its priority.
    Where the policy is refused (not Linux, a sandbox) ``func`` still runs."""
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (OSError, AttributeError) as exc:
            log.warning("cannot run at idle priority: %s", exc)
        try:
            results.append(func())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run, name="idle-priority-load")
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return results[0]


async def run_in_inference_thread(func: Callable[..., T], *args: object) -> T:
    """``func(*args)`` in a new thread at the inference niceness: a model
    loaded here creates its compute threads niced too."""
    loop = asyncio.get_running_loop()
    result: asyncio.Future[T] = loop.create_future()

    def deliver(value: T | None, error: BaseException | None) -> None:
        if result.done():
            return
        if error is not None:
            result.set_exception(error)
        else:
            result.set_result(value)  # type: ignore[arg-type]

    def hand_over(value: T | None, error: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(deliver, value, error)
        except RuntimeError:
            # The loop closed while this ran: the service stopped during its
            # start-up, and nobody waits for the result any more.
            log.info(
                "a model load ended after the service stopped",
                extra={
                    "load": getattr(func, "__qualname__", repr(func)),
                    "error": repr(error) if error is not None else None,
                },
            )

    def run() -> None:
        lower_this_thread()
        try:
            value = func(*args)
        except BaseException as exc:
            hand_over(None, exc)
        else:
            hand_over(value, None)

    threading.Thread(target=run, name="model-load").start()
    return await result
