"""The built wheel carries what the service serves: installed outside the
checkout, it serves the demo page and the browser SDK. A real wheel built
by pip from this tree, a real server process running from it."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import zipfile
from pathlib import Path

import aiohttp
import pytest

from voice_agent.server.sdk import SDK_FILES
from voice_agent.testing.ports import free_port

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
SDK_MODULES = [name for name in SDK_FILES if name.endswith(".js")]
# What a build reads; copied, so the build's own folders stay out of the checkout.
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "voice_agent", "web")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__")
            )
        else:
            shutil.copy2(ROOT / name, source / name)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", str(source), "-w", str(out)],
        check=True,
        timeout=600,
    )
    (built,) = out.glob("voice_agent-*.whl")
    return built


def test_the_wheel_carries_the_page_and_the_sdk(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for name in ("index.html", "app.js", "voice-agent.d.ts", *SDK_MODULES):
        assert f"voice_agent/web/{name}" in names, sorted(names)
    assert not [n for n in names if n.startswith("voice_agent/testing/")]  # checkout only


async def test_the_installed_wheel_serves_the_page_and_the_sdk(
    wheel: Path, tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    target = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    await asyncio.to_thread(
        subprocess.run, [*install, "--target", str(target), str(wheel)], check=True, timeout=300
    )
    # Run from the installed copy (first on the path), from outside the checkout;
    # its dependencies come from this environment.
    env = {**os.environ, "PYTHONPATH": str(target)}
    where = (
        await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", "import voice_agent; print(voice_agent.__file__)"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        )
    ).stdout
    assert where.startswith(str(target)), where
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "voice_agent", "serve", "--port", str(port)),
        # No LLM is needed to serve a page: one that is not there.
        *("--llm-base-url", f"http://127.0.0.1:{free_port()}/v1", "--log-level", "WARNING"),
        env=env,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with asyncio.timeout(180):
            while True:
                try:
                    async with http.get(url + "/") as page:
                        assert page.status == 200
                        assert "<title>Voice agent</title>" in await page.text()
                        break
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.25)  # still starting
        async with http.get(url + "/sdk/voice-agent.js") as sdk:
            assert sdk.status == 200 and "export" in await sdk.text()
        async with http.get(url + "/web/app.js") as app:
            assert app.status == 200
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            await process.wait()
