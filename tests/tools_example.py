"""A tools module as ``--tools tests.tools_example`` loads it."""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from voice_agent.session.ids import new_id  # imported: not a tool


def get_weather(city: str, unit: Literal["celsius", "fahrenheit"] = "celsius") -> str:
    """Current weather in a city.

    Args:
        city: The city name, e.g. Paris.
        unit: Temperature unit.
    """
    degrees = 24 if unit == "celsius" else 75
    return f"sunny in {city}, {degrees} degrees {unit}"


async def slow_lookup(query: str) -> str:
    """Look something up (takes a long time)."""
    await asyncio.sleep(30)
    return query


def blocking_sum(numbers: list[float]) -> dict[str, float]:
    """Add numbers up in a blocking way."""
    time.sleep(0.05)  # a blocking call: it must run off the event loop
    return {"sum": sum(numbers)}


def broken(flag: bool | None = None) -> str:
    """Always fails."""
    raise RuntimeError("the database is down")


def _private_helper() -> str:
    return new_id("x")
