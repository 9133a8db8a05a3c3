"""Piper keeps its ONNX Runtime arenas while it is used and gives them back
once it has been idle: an idle service holds ~76 MB less, a busy one is
as fast as ever."""

from __future__ import annotations

import asyncio
import ctypes

import numpy as np
import pytest

from voice_agent.backends.base import synthesize
from voice_agent.backends.tts import piper_tts
from voice_agent.backends.tts.piper_tts import PiperTts, default_voice_path

SENTENCE = "Thanks for calling. Your appointment is confirmed for Tuesday at three."


def _anonymous_mb() -> float:
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # what is free goes back, as the service does
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon")


@pytest.mark.models
async def test_the_arenas_go_back_after_an_idle_spell_and_not_while_in_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(piper_tts, "ARENA_IDLE_S", 1.0)
    tts = PiperTts(default_voice_path(), 1.0, threads=2)
    releases = 0
    release = tts._release_blocking
    loop = asyncio.get_running_loop()
    done = asyncio.Event()

    def counted() -> None:  # in the worker's thread
        nonlocal releases
        releases += 1
        release()
        loop.call_soon_threadsafe(done.set)

    monkeypatch.setattr(tts, "_release_blocking", counted)
    # A caller speaking every 0.2 s keeps them: the spell counts from the
    # end of a synthesis, however slow it is.
    try:
        before = _anonymous_mb()
        await synthesize(tts, SENTENCE)
        grown = _anonymous_mb()
        for _ in range(5):
            await synthesize(tts, "Sure.")
            last_ended = loop.time()
            await asyncio.sleep(0.2)
        assert releases == 0
        await asyncio.wait_for(done.wait(), 10)
        assert loop.time() - last_ended >= 0.95  # not before the quiet spell was out
        assert releases == 1
        released = _anonymous_mb()
        assert grown - before > 40, (before, grown)
        assert grown - released > 30, (grown, released)
        # The next reply builds them again, and is whole.
        audio = await synthesize(tts, SENTENCE)
        assert len(audio) > tts.sample_rate and np.abs(audio).max() > 1000
        assert releases == 1
    finally:
        tts.close()
