"""The shared TTS takes a reply's first piece before other replies' later
pieces, and never starts a piece whose caller went away."""

from __future__ import annotations

import asyncio
import threading

import pytest

from voice_agent.backends.base import PriorityInferenceWorker, synthesize
from voice_agent.backends.tts.piper_tts import PiperTts, default_voice_path


async def test_urgent_jobs_jump_the_queue_and_cancelled_ones_never_run() -> None:
    worker = PriorityInferenceWorker("test")
    gate = threading.Event()
    busy_running = threading.Event()
    ran: list[str] = []

    def job(name: str) -> str:
        if name == "busy":
            busy_running.set()
            gate.wait(5)
        ran.append(name)
        return name

    try:
        busy = asyncio.create_task(worker.run(job, "busy"))
        await asyncio.to_thread(busy_running.wait, 5)  # the thread holds "busy"; the rest queue
        later = [asyncio.create_task(worker.run(job, f"later-{i}")) for i in range(2)]
        gone = asyncio.create_task(worker.run(job, "gone"))
        first = asyncio.create_task(worker.run(job, "first-words", urgent=True))
        async with asyncio.timeout(5):
            # All four queued (their first steps): no event marks it.
            while len(worker._normal) + len(worker._urgent) < 4:  # noqa: ASYNC110
                await asyncio.sleep(0)
        gone.cancel()
        gate.set()
        assert await first == "first-words"
        await asyncio.gather(busy, *later)
        with pytest.raises(asyncio.CancelledError):
            await gone
        assert ran == ["busy", "first-words", "later-0", "later-1"]
    finally:
        worker.close()


async def test_a_parallel_worker_runs_that_many_jobs_at_once_and_queues_the_rest() -> None:
    worker = PriorityInferenceWorker("test", parallel=2)
    both_running = threading.Barrier(2, timeout=5)  # broken unless two run at once
    urgent_ran = threading.Event()
    order: list[str] = []

    def pair(name: str) -> str:
        both_running.wait()
        if name == "b":  # holds its thread until the first free one ran "urgent"
            urgent_ran.wait(5)
        order.append(name)
        return name

    def after(name: str) -> str:
        order.append(name)
        if name == "urgent":
            urgent_ran.set()
        return name

    try:
        results = await asyncio.gather(
            worker.run(pair, "a"),
            worker.run(pair, "b"),
            worker.run(after, "third"),  # waits for a free thread
            worker.run(after, "urgent", urgent=True),
        )
        assert list(results) == ["a", "b", "third", "urgent"]
        # "urgent" took the first free thread ahead of "third", which had
        # queued first. Once "urgent" has run, "b" (released by it) and
        # "third" (on the thread "urgent" freed) race: either may log first.
        assert order[:2] == ["a", "urgent"]
        assert sorted(order[2:]) == ["b", "third"]
    finally:
        worker.close()


@pytest.mark.models
async def test_a_first_piece_is_synthesized_before_queued_later_pieces() -> None:
    tts = PiperTts(default_voice_path(), 1.0, threads=1)
    done: list[str] = []

    async def say(text: str, urgent: bool) -> None:
        await synthesize(tts, text, urgent=urgent)
        done.append(text)

    try:
        long = "This sentence is long enough to keep the voice busy for a while, really."
        await asyncio.gather(
            say(long, False),  # runs first: the worker was idle
            say("Later sentence one.", False),
            say("Later sentence two.", False),
            say("Hello!", True),  # another caller's first words
        )
        assert done.index("Hello!") == 1, done
    finally:
        tts.close()
