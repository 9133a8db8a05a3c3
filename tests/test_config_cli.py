"""Settings precedence and the ``voice-agent`` command."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.conftest import serve_refusing_to_start
from voice_agent.cli import build_parser, main
from voice_agent.config import Settings, load_settings
from voice_agent.testing.ports import free_port


def test_flags_beat_environment_which_beats_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "voice.toml"
    config.write_text("port = 9001\nmax_calls = 3\nturn_silence_ms = 700\n")
    monkeypatch.setenv("VOICE_AGENT_MAX_CALLS", "5")
    monkeypatch.setenv("VOICE_AGENT_TURN_SILENCE_MS", "650")
    settings = load_settings({"turn_silence_ms": 600, "port": None}, config)
    assert settings.port == 9001  # only the file sets it
    assert settings.max_calls == 5  # the environment beats the file
    assert settings.turn_silence_ms == 600  # the flag beats both


def test_json_config_and_comma_lists(tmp_path: Path) -> None:
    config = tmp_path / "voice.json"
    config.write_text(json.dumps({"cors-origins": "https://a.example, https://b.example"}))
    settings = load_settings({"ice_servers": "stun:stun.internal:3478"}, config)
    assert settings.cors_origins == ["https://a.example", "https://b.example"]
    assert settings.ice_servers == ["stun:stun.internal:3478"]


def test_defaults_assume_no_public_stun_server() -> None:
    assert Settings().ice_servers == []
    assert Settings().host == "127.0.0.1" and Settings().port == 8080


def subprocess_help() -> str:
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    serve: argparse.ArgumentParser = commands.choices["serve"]
    return serve.format_help()


def test_every_setting_is_a_documented_flag() -> None:
    help_text = subprocess_help()
    for name, field in Settings.model_fields.items():
        assert "--" + name.replace("_", "-") in help_text
        assert field.description, name


def test_help_states_each_default_once() -> None:
    help_text = " ".join(subprocess_help().split())
    assert not re.search(r"\((default|here): [^)]*\) \((default|here):", help_text)
    assert "(default: 8080)" in help_text
    # --workers' description says how its default is chosen; the value follows.
    options = help_text.split("options:", 1)[1]
    workers = options.split("--workers WORKERS", 1)[1].split("--drain-timeout-s", 1)[0]
    assert workers.count("default") == 1 and "(here: " in workers


def test_help_prints_descriptions_as_written() -> None:
    help_text = " ".join(subprocess_help().split())
    # A description's "7 % slower" is text, not a format argparse fills in.
    assert "'prog':" not in help_text and "~7 % slower" in help_text


def test_invalid_settings_are_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["serve", "--max-calls", "0"]) == 2
    assert "max_calls" in capsys.readouterr().err


def test_an_output_lead_the_buffer_cannot_hold_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["serve", "--output-buffer-ms", "100", "--output-lead-ms", "100"]) == 2
    assert (
        "--output-lead-ms (100) must be under --output-buffer-ms (100)" in capsys.readouterr().err
    )


@pytest.mark.models
@pytest.mark.slow
async def test_serve_starts_becomes_ready_and_stops_cleanly() -> None:
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "voice_agent",
        "serve",
        "--port",
        str(port),
        "--log-format",
        "json",
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            ready = False
            async with asyncio.timeout(90):
                while not ready:
                    try:
                        async with http.get(url + "/readyz") as response:
                            ready = response.status == 200
                    except aiohttp.ClientConnectionError:
                        pass
                    if not ready:
                        await asyncio.sleep(0.2)  # waiting for a child process to boot
            async with http.get(url + "/") as page:
                assert page.status == 200 and "<html" in (await page.text()).lower()
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            code = await process.wait()
    assert code == 0
    assert process.stderr is not None
    lines = (await process.stderr.read()).decode().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert any(r["msg"] == "engine ready" for r in records)
    # The embedded llama.cpp server went with it.
    (llama,) = [r for r in records if r["msg"] == "embedded llama.cpp server ready"]
    host, port = llama["base_url"].split("//")[1].split("/")[0].split(":")
    with pytest.raises(OSError), socket.create_connection((host, int(port)), timeout=2):
        pass


async def test_a_missing_model_fails_at_start_up_with_how_to_fix_it(tmp_path: Path) -> None:
    text = await serve_refusing_to_start("--stt-model", str(tmp_path / "nowhere"))
    assert "cannot start" in text and "model.bin" in text
