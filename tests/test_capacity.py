"""The capacity from a turn's measured CPU cost (voice_agent/capacity.py):
measured through the models themselves, cached by what it depends on, and
what a server started without --max-calls admits."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from tests.conftest import fake_settings, run_server
from tests.conftest import test_settings as settings_for_test
from voice_agent import capacity
from voice_agent.capacity import (
    IDLE_CALL_CORES,
    CpuClock,
    TurnCost,
    calls_for,
    measure_turn_cost,
    measured_turn_cost,
)
from voice_agent.cpu import available_cores
from voice_agent.engine import Engine
from voice_agent.testing.fake_models import FakeStt, FakeTts
from voice_agent.testing.scripted_llm import ScriptedLlmServer


def test_a_costlier_turn_or_fewer_cores_carry_fewer_calls() -> None:
    cheap, dear = TurnCost(0.1, 0.0, 0.1), TurnCost(0.3, 0.8, 0.3)
    assert calls_for(dear, 2) < calls_for(cheap, 2)
    assert calls_for(dear, 1) < calls_for(dear, 4) < calls_for(dear, 16)
    # The steady cost of a call alone bounds it: no turn cost, no infinity.
    free = calls_for(TurnCost(0.0, 0.0, 0.0), 2)
    assert free == int(2 * capacity.UTILISATION / IDLE_CALL_CORES)
    assert calls_for(TurnCost(100.0, 100.0, 100.0), 1) == 1  # never none


async def test_the_cost_is_measured_once_and_cached_by_what_it_depends_on(
    tmp_path: Path,
) -> None:
    settings = settings_for_test(stt="fake", tts="fake")
    stt, tts = FakeStt(), FakeTts()
    clock = CpuClock([])
    first = await measured_turn_cost(settings, stt, tts, None, clock, cache=tmp_path)
    assert stt.requests["final"] == 2  # the phrase, twice: the second is kept
    assert [text for text, _, _ in tts.spoken] == [capacity.SPOKEN_REPLY] * 2
    assert first.llm_s == 0.0

    again = await measured_turn_cost(settings, stt, tts, None, clock, cache=tmp_path)
    assert again == first and stt.requests["final"] == 2  # from the cache, no work
    other = settings_for_test(stt="fake", tts="fake", stt_model="tiny")
    await measured_turn_cost(other, stt, tts, None, clock, cache=tmp_path)
    assert stt.requests["final"] == 4  # another model: measured again
    assert len(list((tmp_path / capacity.CACHE_FOLDER).glob("*.json"))) == 2
    assert not list((tmp_path / capacity.CACHE_FOLDER).glob("*.tmp"))


async def test_a_cache_that_cannot_be_written_still_gives_the_cost(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    settings = settings_for_test(stt="fake", tts="fake")
    cost = await measured_turn_cost(settings, FakeStt(), FakeTts(), None, CpuClock([]), blocked)
    assert cost.total_s >= 0.0


async def test_a_turn_with_the_embedded_llm_counts_llama_servers_cpu(engine: Engine) -> None:
    """The real models: each stage costs CPU, and the reply's tokens are
    mostly llama-server's, a process of its own, which the clock reads."""
    models = engine.models
    assert models is not None and engine.llama is not None and engine.llama.pid is not None
    with_child = await measure_turn_cost(
        models.stt, models.tts, models.llm, CpuClock([engine.llama.pid])
    )
    alone = await measure_turn_cost(models.stt, models.tts, models.llm, CpuClock([]))
    assert with_child.stt_s > 0.0 and with_child.tts_s > 0.0
    # This process only streams the reply; the server computes it.
    assert with_child.llm_s > 2 * alone.llm_s, (with_child, alone)
    assert (
        1
        <= calls_for(with_child, available_cores())
        < calls_for(TurnCost(with_child.stt_s, 0.0, with_child.tts_s), available_cores())
    )


async def test_a_server_without_max_calls_admits_what_the_measured_cost_allows(
    fake_llm: ScriptedLlmServer,
    http: aiohttp.ClientSession,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("VOICE_AGENT_CACHE", str(tmp_path))
    settings = fake_settings(fake_llm, max_calls=None)
    engine = Engine(settings)
    await engine.start()
    try:
        assert engine.turn_cost is not None and engine.turn_cost.llm_s == 0.0  # a remote LLM
        expected = calls_for(engine.turn_cost, available_cores())
        assert engine.max_calls == expected
        assert list((tmp_path / "voice-agent" / capacity.CACHE_FOLDER).glob("*.json"))
        for given, admitted in ((None, expected), (3, 3)):  # --max-calls replaces it
            settings = fake_settings(fake_llm, max_calls=given)
            async with (
                run_server(settings, engine) as server,
                http.get(f"{server.url}/v1/stats") as stats,
            ):
                body = await stats.json()
                assert body["max_calls"] == admitted
                assert body["turn_cost"]["total_s"] == round(engine.turn_cost.total_s, 3)
    finally:
        await engine.stop()
