"""Fixtures for the STT tests: the tiny NeMo model (built once per run), the
parakeet backend loaded from it, and engines that serve it alongside the
shared engine's VAD, LLM and TTS."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.conftest import RunningServer, run_server, test_settings
from voice_agent.backends import registry
from voice_agent.backends.base import SttBackend
from voice_agent.config import Settings
from voice_agent.engine import Engine
from voice_agent.session.session import Models
from voice_agent.testing.tiny_nemo import build_tiny_ctc


class SharedEngine(Engine):
    """An engine serving models another engine loaded, with its own STT:
    one llama.cpp server for the whole test run."""

    def __init__(self, settings: Settings, models: Models) -> None:
        super().__init__(settings)
        self.models = models

    @property
    def ready(self) -> bool:
        return True


@pytest.fixture(scope="session")
def tiny_nemo_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_ctc(tmp_path_factory.mktemp("tiny-nemo"))


def parakeet_settings(model: Path, **overrides: Any) -> Settings:
    return test_settings(stt="parakeet", stt_model=str(model), stt_device="cpu", **overrides)


async def load_stt(settings: Settings) -> SttBackend:
    stt: SttBackend = await asyncio.to_thread(registry.create, "stt", settings.stt, settings)
    return stt


@pytest_asyncio.fixture(scope="session")
async def parakeet(tiny_nemo_model: Path) -> AsyncIterator[SttBackend]:
    """The process-wide parakeet backend, as `--stt parakeet` would load it."""
    stt = await load_stt(parakeet_settings(tiny_nemo_model))
    yield stt
    stt.close()


def engine_with_stt(engine: Engine, stt: SttBackend, settings: Settings) -> SharedEngine:
    return engine_with_models(engine, settings, stt=stt)


def engine_with_models(engine: Engine, settings: Settings, **models: Any) -> SharedEngine:
    """The shared engine's models, some of them replaced (``stt=``, ``llm=``...)."""
    assert engine.models is not None
    return SharedEngine(settings, dataclasses.replace(engine.models, **models))


@pytest_asyncio.fixture
async def parakeet_server(
    engine: Engine, parakeet: SttBackend, tiny_nemo_model: Path
) -> AsyncIterator[RunningServer]:
    settings = parakeet_settings(tiny_nemo_model)
    async with run_server(settings, engine_with_stt(engine, parakeet, settings)) as server:
        yield server
