"""Start-up of the LLM side: API key fallbacks, backend choice, tools module."""

from __future__ import annotations

import pytest

from tests.conftest import serve_refusing_to_start
from tests.conftest import test_settings as settings_for
from voice_agent.backends.llm.chat_completions import OpenAIChatLlm
from voice_agent.backends.llm.responses import OpenAIResponsesLlm
from voice_agent.engine import Engine
from voice_agent.testing.ports import free_port
from voice_agent.testing.scripted_llm import (
    Script,
    close_quietly,
    engine_with_llm,
    make_llm,
    scripted_llm_server,
    text_events,
)

REMOTE = f"http://127.0.0.1:{free_port()}/v1"


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        (None, {"OPENAI_API_KEY": "sk-openai", "HF_TOKEN": "hf-token"}, "sk-openai"),
        (None, {"HF_TOKEN": "hf-token"}, "hf-token"),
        ("sk-flag", {"OPENAI_API_KEY": "sk-openai"}, "sk-flag"),
        (None, {}, None),
    ],
)
async def test_the_api_key_falls_back_to_the_usual_environment_variables(
    monkeypatch: pytest.MonkeyPatch, flag: str | None, env: dict[str, str], expected: str | None
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    engine = Engine(settings_for(llm_base_url=REMOTE, llm_api_key=flag, llm_model="m"))
    llm = await engine.start_llm()
    try:
        assert engine.llm_config is not None and engine.llm_config.api_key == expected
        assert isinstance(llm, OpenAIChatLlm)
    finally:
        await llm.aclose()


async def test_the_responses_backend_is_chosen_by_flag() -> None:
    engine = Engine(settings_for(llm_base_url=REMOTE, llm_backend="responses", llm_model="m"))
    llm = await engine.start_llm()
    try:
        assert isinstance(llm, OpenAIResponsesLlm)
    finally:
        await llm.aclose()


async def test_a_missing_tools_module_stops_start_up_with_a_clear_message() -> None:
    text = await serve_refusing_to_start("--tools", "no_such_tools_module")
    assert "cannot start" in text and "no_such_tools_module" in text


@pytest.mark.parametrize(
    ("prefill", "requests"),
    [(None, 0), (False, 0), (True, 1)],  # None: the default for a remote endpoint, off
)
async def test_the_start_up_warm_up_respects_prefill_and_the_api_s_minimum(
    engine: Engine, prefill: bool | None, requests: int
) -> None:
    """A remote endpoint bills each request: warmed only when prefill is asked for,
    and then with an output cap the Responses API accepts (at least 16)."""
    async with scripted_llm_server() as peer:
        peer.add(Script(text_events("responses", "Hello there.")))
        llm = make_llm("responses", peer.base_url)
        warmed = engine_with_llm(engine, llm, llm_base_url=peer.base_url, llm_prefill=prefill)
        try:
            await warmed._warm_up()
        finally:
            await close_quietly(llm)
        assert len(peer.requests) == requests
        if requests:
            assert peer.bodies()[0]["max_output_tokens"] >= 16
