"""Blocking loads run in their own thread; stopping the service while one
runs leaves no exception behind in that thread."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from voice_agent.cpu import run_in_inference_thread


def load_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "model-load"]


def test_a_load_that_outlives_its_event_loop_ends_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A shutdown during start-up closes the event loop under a model still
    loading: the thread finishes, says so, and raises nothing."""
    caplog.set_level(logging.INFO, logger="voice_agent.cpu")
    failures: list[threading.ExceptHookArgs] = []
    previous_hook, threading.excepthook = threading.excepthook, failures.append
    release = threading.Event()
    loop = asyncio.new_event_loop()
    started: asyncio.Future[None] = loop.create_future()

    def slow_load() -> str:
        loop.call_soon_threadsafe(started.set_result, None)
        release.wait(10)
        return "model"

    try:
        loads_before = load_threads()
        loading = loop.create_task(run_in_inference_thread(slow_load))
        loop.run_until_complete(started)
        (thread,) = [t for t in load_threads() if t not in loads_before]
        loading.cancel()  # the service stops: start-up is cancelled
        loop.run_until_complete(asyncio.gather(loading, return_exceptions=True))
        loop.close()
        release.set()
        thread.join(10)
    finally:
        threading.excepthook = previous_hook
        release.set()
    assert not thread.is_alive()
    assert failures == []
    assert any("ended after the service stopped" in r.getMessage() for r in caplog.records)


async def test_a_load_returns_its_value_and_raises_its_error() -> None:
    def load() -> str:
        return "model"

    def broken_load() -> str:
        raise ValueError("no such model")

    assert await run_in_inference_thread(load) == "model"
    with pytest.raises(ValueError, match="no such model"):
        await run_in_inference_thread(broken_load)
