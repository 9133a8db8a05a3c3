"""The embedded llama.cpp server is supervised: killed, it comes back where
its clients expect it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from voice_agent.backends import OMP_DEFAULT_MARK
from voice_agent.backends.base import ChatMessage
from voice_agent.backends.llm.chat_completions import OpenAIChatLlm
from voice_agent.backends.llm.http_client import HttpLlmConfig
from voice_agent.backends.llm.llama_server import (
    EmbeddedLlamaServer,
    OmpWait,
    default_model_path,
    find_llama_server,
)


async def reply(llm: OpenAIChatLlm) -> str:
    parts = [d async for d in llm.stream_reply([ChatMessage("user", "Say hi.")], 4, 0.0)]
    return "".join(p for p in parts if isinstance(p, str))


@pytest.mark.models
async def test_a_killed_server_is_restarted_on_the_same_port() -> None:
    server = EmbeddedLlamaServer(default_model_path(), threads=1, ctx=512)
    await server.start()
    llm = OpenAIChatLlm(HttpLlmConfig(server.base_url, None, "test", first_token_timeout_s=30))
    try:
        assert await reply(llm)
        url = server.base_url
        process = server._process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        async with asyncio.timeout(60):
            # Observing another process restart: nothing to await but time.
            while server.restarts == 0 or not server.running:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert server.base_url == url
        assert await reply(llm)
    finally:
        await llm.aclose()
        await server.stop()
    assert not server.running


def children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead: only its parent has yet to read its status.
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"


@pytest.mark.models
async def test_a_wrapper_commands_server_goes_with_it_on_a_restart_and_at_stop() -> None:
    """--llama-server-command may be a wrapper: a shell that starts the server
    and waits. The death signal reaches only the wrapper, so the supervisor
    must stop the server it started too, or a restart finds the port taken
    and the stopped service leaves a server running."""
    wrapper = ["sh", "-c", '"$0" "$@" & wait', str(find_llama_server())]
    arguments = "--model {model} --host {host} --port {port} --ctx-size {ctx} --threads {threads}"
    server = EmbeddedLlamaServer(
        default_model_path(), threads=1, ctx=512, command=[*wrapper, *arguments.split()]
    )
    started: list[int] = []
    await server.start()
    llm = OpenAIChatLlm(HttpLlmConfig(server.base_url, None, "test", first_token_timeout_s=30))
    try:
        assert server._process is not None
        (first,) = children(server._process.pid)
        started.append(first)
        assert await reply(llm)
        server._process.send_signal(signal.SIGKILL)  # the wrapper dies, its server would not
        async with asyncio.timeout(60):
            # Observing another process restart: nothing to await but time.
            while server.restarts == 0 or not server.running:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert not alive(first)
        (second,) = children(server._process.pid)
        started.append(second)
        assert await reply(llm)
    finally:
        await llm.aclose()
        await server.stop()
        left = [pid for pid in started if alive(pid)]
        for pid in left:  # a failed run must not leave them behind either
            os.kill(pid, signal.SIGKILL)
    assert left == []


def environment_of(pid: int) -> dict[str, str]:
    pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(p.decode().split("=", 1) for p in pairs if b"=" in p)


@pytest.mark.models
async def test_with_spin_the_server_does_not_inherit_this_processs_passive_openmp_waiting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """This process's OpenMP runtimes wait passively (set at import); ggml's
    threads meet at a barrier after every operation, where passive waiting
    made one caller's tokens 2.5x as slow (docs/measurements.md). Nor does
    it inherit the service's secrets."""
    monkeypatch.setenv("VOICE_AGENT_API_KEYS", "sk-never-shown-to-llama")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-never-shown-to-llama")
    monkeypatch.setenv("HF_TOKEN", "hf-never-shown-to-llama")
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    cases: tuple[tuple[OmpWait, str | None], ...] = (("spin", None), ("passive", "PASSIVE"))
    for omp_wait, expected in cases:
        server = EmbeddedLlamaServer(default_model_path(), threads=1, ctx=512, omp_wait=omp_wait)
        await server.start()
        try:
            assert server._process is not None
            child = environment_of(server._process.pid)
            assert child.get("OMP_WAIT_POLICY") == expected, omp_wait
            assert child["PATH"] == os.environ["PATH"]  # the basics are passed on
            # The service's secrets are not (the fixture below puts some there).
            assert not {"VOICE_AGENT_API_KEYS", "OPENAI_API_KEY", "HF_TOKEN"} & set(child)
        finally:
            await server.stop()


def llama_environment_in_a_new_process(env: dict[str, str], omp_wait: str) -> dict[str, str]:
    """What a service started with ``env`` would give its llama-server."""
    code = (
        "import json; from voice_agent.backends.llm import llama_server; "
        f"print(json.dumps(llama_server.child_environment({omp_wait!r})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return dict(json.loads(done.stdout))


def test_an_operators_openmp_wait_policy_wins_and_an_inherited_default_is_not_theirs() -> None:
    # A service started by a process that imported this package (a benchmark,
    # a test) inherits its default, marked as such: the setting decides.
    inherited = dict(os.environ)
    spin = llama_environment_in_a_new_process(inherited, "spin")
    assert "OMP_WAIT_POLICY" not in spin and OMP_DEFAULT_MARK not in spin
    assert spin["GOMP_SPINCOUNT"] == "1000"
    assert (
        llama_environment_in_a_new_process({**inherited, "GOMP_SPINCOUNT": "5"}, "spin")[
            "GOMP_SPINCOUNT"
        ]
        == "5"
    )
    assert llama_environment_in_a_new_process(inherited, "passive")["OMP_WAIT_POLICY"] == "PASSIVE"
    # One the operator set is theirs, passed on as it is whatever the setting.
    operator = {k: v for k, v in os.environ.items() if k != OMP_DEFAULT_MARK}
    for policy in ("PASSIVE", "ACTIVE"):
        for omp_wait in ("spin", "passive"):
            chosen = llama_environment_in_a_new_process(
                {**operator, "OMP_WAIT_POLICY": policy}, omp_wait
            )
            assert chosen["OMP_WAIT_POLICY"] == policy


def private_kib(pid: int) -> int:
    """The process's own memory (anonymous pages: the KV cache, not the
    mapped weights)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon")


@pytest.mark.models
async def test_a_fresh_server_holds_none_of_its_kv_pool_in_f16_or_q8_0() -> None:
    # 4 slots of 1024 tokens: SmolLM2-135M (30 layers, 3 KV heads of 64)
    # needs 90 MiB for them in f16, 48 in q8_0. llama.cpp zeroes the pool at
    # start-up; our build (deploy/llama-server/cpu-buffer-clear-pages.patch)
    # does it by handing the pages back, so a fresh server holds less than
    # the pool, and as little with either type. (Unpatched: f16 116 MiB.)
    f16_pool_kib = 4 * 1024 * 30 * 2 * 3 * 64 * 2 // 1024
    at_ready: dict[str, int] = {}
    for kv_type in ("f16", "q8_0"):
        server = EmbeddedLlamaServer(
            default_model_path(), threads=1, ctx=1024, parallel=4, kv_type=kv_type
        )
        await server.start()
        llm = OpenAIChatLlm(HttpLlmConfig(server.base_url, None, "test", first_token_timeout_s=30))
        try:
            assert server._process is not None
            at_ready[kv_type] = private_kib(server._process.pid)
            assert await reply(llm)
        finally:
            await llm.aclose()
            await server.stop()
    assert at_ready["f16"] < f16_pool_kib * 2 // 3, (at_ready, f16_pool_kib)
    # The pools differ by 42 MiB; untouched, the servers differ by much less.
    assert abs(at_ready["f16"] - at_ready["q8_0"]) < 12 * 1024, at_ready
