"""Server-side tools: loading a module, schemas from hints and docstrings,
running calls with a timeout, and failures turned into text for the model."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from voice_agent.backends.base import ToolCall
from voice_agent.session.tools import ToolLoadError, ToolRegistry


@pytest.fixture
def registry() -> ToolRegistry:
    return ToolRegistry.from_module("tests.tools_example", timeout_s=0.5)


def test_public_functions_of_the_module_become_tools(registry: ToolRegistry) -> None:
    assert [t.name for t in registry.specs] == [
        "get_weather",
        "slow_lookup",
        "blocking_sum",
        "broken",
    ]


def test_the_schema_comes_from_hints_and_docstring(registry: ToolRegistry) -> None:
    weather = registry.specs[0]
    assert weather.description == "Current weather in a city."
    assert weather.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city name, e.g. Paris."},
            "unit": {
                "type": "string",
                "enum": ["celsius", "fahrenheit"],
                "description": "Temperature unit.",
            },
        },
        "required": ["city"],
    }
    numbers = registry.specs[2].parameters["properties"]["numbers"]
    assert numbers == {"type": "array", "items": {"type": "number"}}
    assert registry.specs[3].parameters["properties"]["flag"] == {"type": "boolean"}
    assert registry.specs[3].parameters["required"] == []


def test_a_missing_module_is_a_clear_error() -> None:
    with pytest.raises(ToolLoadError, match="no_such_tools_module"):
        ToolRegistry.from_module("no_such_tools_module", 1.0)


async def test_a_sync_tool_runs_off_the_event_loop(registry: ToolRegistry) -> None:
    result = await registry.call(ToolCall("c1", "get_weather", '{"city": "Paris"}'))
    assert result == "sunny in Paris, 24 degrees celsius"
    total = await registry.call(ToolCall("c2", "blocking_sum", '{"numbers": [1, 2.5]}'))
    assert json.loads(total) == {"sum": 3.5}


async def test_a_slow_tool_times_out_with_a_message_for_the_model(
    registry: ToolRegistry,
) -> None:
    started = time.monotonic()
    result = await registry.call(ToolCall("c1", "slow_lookup", '{"query": "x"}'))
    assert result == "error: slow_lookup did not finish within 0.5 s"
    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (ToolCall("c", "broken", "{}"), "error: broken failed: RuntimeError: the database is down"),
        (ToolCall("c", "nope", "{}"), "error: there is no tool named 'nope'"),
        (ToolCall("c", "get_weather", "{not json"), "error: invalid arguments for get_weather"),
        (ToolCall("c", "get_weather", "[1]"), "error: invalid arguments for get_weather"),
        (ToolCall("c", "get_weather", '{"town": "x"}'), "error: invalid arguments for get_weather"),
    ],
)
async def test_failures_become_text_for_the_model(
    registry: ToolRegistry, call: ToolCall, message: str
) -> None:
    assert (await registry.call(call)).startswith(message)


async def test_stuck_sync_tools_fill_their_own_pool_not_the_loop_s() -> None:
    """A timed-out sync tool keeps its thread; once all are taken, calls are
    refused with a message, and the loop's default pool (DNS) stays free."""
    release = threading.Event()

    def stuck_lookup(query: str) -> str:
        """Blocks until released."""
        release.wait(30)
        return query

    registry = ToolRegistry([stuck_lookup], timeout_s=0.2, max_threads=2)
    call = ToolCall("call_1", "stuck_lookup", '{"query": "x"}')
    try:
        timed_out = await asyncio.gather(registry.call(call), registry.call(call))
        assert list(timed_out) == ["error: stuck_lookup did not finish within 0.2 s"] * 2
        refused = await registry.call(call)
        assert refused.startswith("error: stuck_lookup was not run: 2 earlier tool calls")
        # The default executor is untouched: a hostname lookup still runs.
        await asyncio.wait_for(asyncio.get_running_loop().getaddrinfo("localhost", 80), 5)
    finally:
        release.set()
    # Once the threads are free again, calls run. They free them as the tools
    # return, in their own threads: polled, as nothing marks it.
    async with asyncio.timeout(10):
        while registry._busy:  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert await registry.call(call) == "x"
