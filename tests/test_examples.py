"""The examples work as their READMEs say: the SDK as an npm package in a
web app's build, a call from Python, a SIP trunk's gateway settings.
Real npm, node and esbuild, a real server and call, the gateway's own
settings check."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ServerFactory
from voice_agent.server.sdk import SDK_FILES
from voice_agent.testing.audio_data import librivox

ROOT = Path(__file__).resolve().parents[1]
SDK_MODULES = [name for name in SDK_FILES if name.endswith(".js")]
EXAMPLES = ROOT / "examples"
ESBUILD = ROOT / "tests/web/agents-sdk/node_modules/.bin/esbuild"


def run(*command: str, cwd: Path) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-2000:])
    return done.stdout


@pytest.fixture(scope="module")
def sdk_tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    out = tmp_path_factory.mktemp("pack")
    run("npm", "pack", "--silent", "--pack-destination", str(out), cwd=ROOT / "web")
    (tarball,) = out.glob("voice-agent-sdk-*.tgz")
    return tarball


def test_the_sdk_package_holds_the_module_and_its_types(sdk_tarball: Path) -> None:
    listing = run("tar", "tzf", str(sdk_tarball), cwd=sdk_tarball.parent).split()
    assert sorted(listing) == [
        "package/package.json",
        "package/voice-agent-errors.js",
        "package/voice-agent-events.js",
        "package/voice-agent-media.js",
        "package/voice-agent.d.ts",
        "package/voice-agent.js",
    ]


def test_a_web_app_imports_and_bundles_the_sdk_package(sdk_tarball: Path, tmp_path: Path) -> None:
    app = tmp_path / "web-app"
    shutil.copytree(EXAMPLES / "web-app", app)
    # The tarball alone: no registry is asked.
    run("npm", "install", "--offline", "--no-audit", "--no-fund", str(sdk_tarball), cwd=app)
    names = json.loads(
        run(
            "node",
            "--input-type=module",
            "-e",
            "import * as sdk from 'voice-agent-sdk';"
            "console.log(JSON.stringify(Object.keys(sdk).sort()))",
            cwd=app,
        )
    )
    assert {"connect", "VoiceAgent", "VoiceAgentError", "STATES"} <= set(names), names
    installed = app / "node_modules/voice-agent-sdk"
    manifest = json.loads((installed / "package.json").read_text())
    assert (installed / manifest["types"]).is_file()
    # The same modules the service serves at /sdk/.
    for module in SDK_MODULES:
        assert (installed / module).read_bytes() == (ROOT / "web" / module).read_bytes(), module
    if not ESBUILD.exists():
        pytest.skip("esbuild comes with the agents-sdk test packages (make agents-sdk)")
    run(str(ESBUILD), "main.js", "--bundle", "--format=esm", "--outfile=dist/main.js", cwd=app)
    bundle = (app / "dist/main.js").read_text()
    # Resolved through the package's exports and inlined, as any bundler would.
    assert "// node_modules/voice-agent-sdk/voice-agent.js" in bundle
    assert "from 'voice-agent-sdk'" not in bundle and "VoiceAgentError" in bundle


def write_wav(path: Path, samples: np.ndarray, rate: int) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(samples.astype("<i2").tobytes())


@pytest.mark.e2e
async def test_the_python_client_example_has_a_turn_with_the_agent(
    server_factory: ServerFactory, tmp_path: Path
) -> None:
    server = await server_factory()
    question, reply = tmp_path / "question.wav", tmp_path / "reply.wav"
    write_wav(question, librivox("0930"), 16_000)
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, str(EXAMPLES / "python_client.py"), str(question)),
        *("--url", server.url, "--ice-host-address", "127.0.0.1", "--out", str(reply)),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(120):
        out, err = await process.communicate()
    assert process.returncode == 0, err.decode()[-2000:]
    lines = out.decode().splitlines()
    assert any(line.startswith("you said:") and len(line) > 15 for line in lines), lines
    assert any(line.startswith("agent said:") and len(line) > 15 for line in lines), lines
    with wave.open(str(reply), "rb") as wav:
        audio = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    assert audio.size and int(np.abs(audio).max()) > 1000


def test_the_sip_trunk_example_passes_the_gateways_settings_check(tmp_path: Path) -> None:
    settings = {}
    for line in (EXAMPLES / "sip-trunk/trunk.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            settings[name] = value
    users = tmp_path / "sip-users"
    users.write_text("office-pbx:a-long-password-for-the-pbx\n")
    settings["SIP_AUTH_FILE"] = str(users)
    done = subprocess.run(
        [sys.executable, str(ROOT / "deploy/sip/access.py")],
        env={"PATH": "/usr/bin:/bin", **settings},
        capture_output=True,
        text=True,
        timeout=30,
    )
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert "OPEN TO ANYONE" not in said
    assert "trunk carrier: 192.0.2.40/32, 198.51.100.0/28; 20 concurrent calls" in said, said
    assert "trunk office-pbx: digest user (realm 203.0.113.10); 4 concurrent calls" in said
