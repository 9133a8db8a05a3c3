"""Readiness tells the truth about the LLM: an embedded server that dies on
its first decode stops start-up with the reason; one that crash-loops later
makes /readyz and new calls answer 503 until it answers again; a remote
endpoint that is down is a warning shown in /readyz."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.conftest import run_server, serve_refusing_to_start
from tests.conftest import test_settings as settings_for_test
from tests.test_signaling import CALLS, real_offer
from voice_agent.backends.base import ChatMessage, LlmError
from voice_agent.engine import Engine
from voice_agent.testing.ports import free_port

pytestmark = pytest.mark.models

STAND_IN = Path(__file__).parent / "crashing_llm.py"


def stand_in_command(*args: str) -> str:
    return " ".join((sys.executable, str(STAND_IN), "--port", "{port}", *args))


@pytest.mark.parametrize("crash_after", [0, 1], ids=["probe", "prefill"])
@pytest.mark.slow
async def test_a_child_that_dies_during_warm_up_fails_start_up_with_the_reason(
    crash_after: int,
) -> None:
    # 0: dies on the supervisor's one-token probe; 1: on the engine's
    # system-prompt prefill right after it.
    text = await serve_refusing_to_start(
        "--llama-server-command", stand_in_command("--crash-after", str(crash_after))
    )
    line = next(line for line in text.splitlines() if "cannot start" in line)
    assert "killed by SIGSEGV (signal 11) during warm-up" in line
    assert "ggml_backend_amx_mul_mat: about to fault" in line  # its last output
    assert "to try:" in line and "make run" in line and "--llm-base-url" in line


@pytest_asyncio.fixture
async def fragile_engine(tmp_path: Path) -> AsyncIterator[tuple[Engine, Path]]:
    flag = tmp_path / "crash"
    engine = Engine(
        settings_for_test(llama_server_command=stand_in_command("--crash-while", str(flag)))
    )
    await engine.start()
    yield engine, flag
    await engine.stop()


async def readyz(http: aiohttp.ClientSession, url: str) -> tuple[int, dict[str, Any], str]:
    async with http.get(url + "/readyz") as response:
        return response.status, await response.json(), response.headers.get("Retry-After", "")


async def wait_for_readyz(
    http: aiohttp.ClientSession, url: str, status: int, timeout_s: float, reason: str = ""
) -> dict[str, Any]:
    """The first /readyz body with this status (and reason text)."""
    async with asyncio.timeout(timeout_s):
        while True:
            code, body, _ = await readyz(http, url)
            if code == status and reason in (body.get("reason") or ""):
                return body
            # Another process restarting on its own backoff: nothing to await.
            await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_a_crash_looping_llm_makes_readyz_and_offers_503_until_it_answers_again(
    fragile_engine: tuple[Engine, Path], http: aiohttp.ClientSession
) -> None:
    engine, flag = fragile_engine
    async with run_server(settings_for_test(), engine) as server:
        status, body, _ = await readyz(http, server.url)
        assert status == 200 and body["llm"]["state"] == "ready"

        flag.touch()  # from now on every completion kills the child
        assert engine.models is not None
        with pytest.raises(LlmError):
            async for _ in engine.models.llm.stream_reply([ChatMessage("user", "Hi")], 8, 0.0):
                pass
        # Restarted, it dies again on the health check, twice: a crash loop.
        await wait_for_readyz(http, server.url, 503, 30, reason="crash-looping")
        _, body, retry_after = await readyz(http, server.url)
        assert body["status"] == "llm_unavailable" and int(retry_after) > 0
        assert "SIGSEGV" in body["reason"] and "3 deaths in the last 60 s" in body["reason"]

        pc, sdp = await real_offer()
        try:
            async with http.post(
                server.url + CALLS, data=sdp, headers={"Content-Type": "application/sdp"}
            ) as response:
                assert response.status == 503 and response.headers["Retry-After"]
                error = (await response.json())["error"]
            assert error["code"] == "llm_unavailable" and "crash-looping" in error["message"]
        finally:
            await pc.close()
        assert len(server.calls) == 0

        async with http.get(server.url + "/v1/stats") as response:
            llm = (await response.json())["llm"]
        assert llm["deaths"] >= 3 and llm["last_exit"]["signal"] == "SIGSEGV"
        assert "ggml_backend_amx_mul_mat: about to fault" in llm["last_exit"]["output_tail"]
        assert llm["last_exit"]["during"] == "health check"

        flag.unlink()  # the next restart answers its health check
        body = await wait_for_readyz(http, server.url, 200, timeout_s=60)
        assert body["llm"]["state"] == "ready" and body["llm"]["restarts"] >= 1
        parts = [d async for d in engine.models.llm.stream_reply([ChatMessage("user", "Hi")], 8, 0)]
        assert "".join(p for p in parts if isinstance(p, str)) == "Hello from the stand-in."


async def test_a_remote_llm_that_is_down_is_a_warning_shown_in_readyz(
    http: aiohttp.ClientSession,
) -> None:
    engine = Engine(settings_for_test(llm_base_url=f"http://127.0.0.1:{free_port()}/v1"))
    await engine.start()  # does not refuse to start: the endpoint may come up later
    try:
        async with run_server(settings_for_test(), engine) as server:
            status, body, _ = await readyz(http, server.url)
        assert status == 200 and body["ready"] is True
        assert body["llm"]["kind"] == "remote" and body["llm"]["reachable"] is False
        assert "ClientConnectorError" in body["llm"]["error"]
    finally:
        await engine.stop()
