"""Start-up of the LLM side: API key fallbacks, backend choice, tools module."""

from __future__ import annotations

import asyncio
import sys

import pytest

from tests.conftest import test_settings as settings_for
from tests.scripted_llm import closed_port
from voice_agent.backends.llama_server import LlamaServerError
from voice_agent.backends.llm_openai import OpenAIChatLlm
from voice_agent.backends.llm_responses import OpenAIResponsesLlm
from voice_agent.engine import Engine

REMOTE = f"http://127.0.0.1:{closed_port()}/v1"


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
    llm = await engine._start_llm()
    try:
        assert engine.llm_config is not None and engine.llm_config.api_key == expected
        assert isinstance(llm, OpenAIChatLlm)
    finally:
        await llm.aclose()


async def test_the_responses_backend_is_chosen_by_flag() -> None:
    engine = Engine(settings_for(llm_base_url=REMOTE, llm_backend="responses", llm_model="m"))
    llm = await engine._start_llm()
    try:
        assert isinstance(llm, OpenAIResponsesLlm)
    finally:
        await llm.aclose()


async def test_the_embedded_server_cannot_serve_the_responses_api() -> None:
    engine = Engine(settings_for(llm_backend="responses"))
    with pytest.raises(LlamaServerError, match="/v1/responses"):
        await engine._start_llm()
    assert engine.llama is None


async def test_a_missing_tools_module_stops_start_up_with_a_clear_message() -> None:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "voice_agent",
        "serve",
        "--port",
        str(closed_port()),
        "--tools",
        "no_such_tools_module",
        "--log-format",
        "text",
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        _, stderr = await process.communicate()
    assert process.returncode == 1
    text = stderr.decode()
    assert "cannot start" in text and "no_such_tools_module" in text
    assert "Traceback" not in text
