"""Piper keeps its ONNX Runtime arenas while it is used and gives them back
once it has been idle: an idle service holds ~76 MB less, a busy one is
as fast as ever."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import numpy as np
import pytest

from voice_agent.backends.base import synthesize
from voice_agent.backends.tts import piper_tts
from voice_agent.backends.tts.piper_tts import PiperTts, default_voice_path

SENTENCE = "Thanks for calling. Your appointment is confirmed for Tuesday at three."

# In an interpreter of its own: a test process's heap, shaped by the tests
# before it, would hide part of what the arenas take and give back.
MEASURE = f"""
import asyncio, ctypes, json
from voice_agent.backends.base import synthesize
from voice_agent.backends.tts.piper_tts import PiperTts, default_voice_path

def anonymous_mb():
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # what is free goes back, as the service does
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024

async def main():
    tts = PiperTts(default_voice_path(), 1.0, threads=2)
    before = anonymous_mb()
    await synthesize(tts, {SENTENCE!r})
    grown = anonymous_mb()
    await tts.release_memory()
    released = anonymous_mb()
    tts.close()
    print(json.dumps([before, grown, released]))

asyncio.run(main())
"""


@pytest.mark.models
def test_a_release_gives_the_arenas_memory_back() -> None:
    run = subprocess.run(
        [sys.executable, "-c", MEASURE], capture_output=True, text=True, timeout=120, check=True
    )
    before, grown, released = json.loads(run.stdout.strip().splitlines()[-1])
    assert grown - before > 40, (before, grown)  # ~85 MB measured
    assert grown - released > 30, (grown, released)  # ~76 MB measured


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
        for _ in range(5):
            await synthesize(tts, "Sure.")
            last_ended = loop.time()
            await asyncio.sleep(0.2)
        assert releases == 0
        await asyncio.wait_for(done.wait(), 10)
        assert loop.time() - last_ended >= 0.95  # not before the quiet spell was out
        assert releases == 1
        # The next reply builds them again, and is whole.
        audio = await synthesize(tts, SENTENCE)
        assert len(audio) > tts.sample_rate and np.abs(audio).max() > 1000
        assert releases == 1
    finally:
        tts.close()
