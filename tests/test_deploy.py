"""deploy/: the linters pass on every file; the CPU image builds with podman
from a locally bootstrapped Debian base (no registry) and, run with host
networking, answers /readyz and one real WebRTC call; compose brings up the
service and coturn, and a call relayed through TURN is answered.

The image and compose tests need root, podman and mmdebstrap (CI installs
them in .ci/run) and skip, saying what is missing, elsewhere. They are
bounded: the base is bootstrapped once per package list (about a minute),
the wheelhouse is downloaded once, and podman's layer cache makes a rebuild
of unchanged sources take seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import os
import resource
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from voice_agent.client import RealtimeClient, fetch_ice_servers
from voice_agent.testing.audio_data import librivox, silence
from voice_agent.testing.ports import free_port
from voice_agent.testing.serving import wait_ready

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
TOOLS = ROOT / ".cache" / "deploy-tools" / "bin"
IMAGE = "localhost/voice-agent:test"
KEY = "sk-deploy-test-0123"
IMAGE_BUILD_TIMEOUT_S = 1800
READY_TIMEOUT_S = 240


def tool(name: str) -> str:
    path = TOOLS / name
    if not path.exists():
        pytest.skip(f"{name} is not installed in {TOOLS.parent} (make deploy-tools)")
    return str(path)


def run(*command: str, timeout: float = 120, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )
    assert done.returncode == 0, f"{command} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_dockerfile_passes_hadolint() -> None:
    run(tool("hadolint"), str(DEPLOY / "docker" / "Dockerfile"))


def test_every_yaml_file_passes_yamllint() -> None:
    files = sorted(str(p) for p in DEPLOY.rglob("*.yaml"))
    assert len(files) >= 8
    run(tool("yamllint"), "--strict", "-c", str(DEPLOY / "yamllint.yaml"), *files)


def test_the_kubernetes_manifests_validate() -> None:
    manifests = sorted(str(p) for p in (DEPLOY / "k8s").glob("*.yaml"))
    output = run(tool("kubernetes-validate"), "--strict", *manifests)
    # Every object was checked against a schema, none skipped.
    kinds = {"statefulset", "service", "poddisruptionbudget", "horizontalpodautoscaler"}
    kinds |= {"deployment", "configmap"}
    assert all(f"resource {kind}/" in output for kind in kinds), output


# --- the TURN relay: deploy/coturn/, as compose and Kubernetes run it -----------

COTURN = DEPLOY / "coturn"

# Networks no caller may reach through the relay (coturn itself refuses the
# unspecified address ::, so IPv6 ranges start after it).
DENIED_NETWORKS = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "255.255.255.255/32",
    "::1/128",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
    "::ffff:0:0/96",
]


def coturn_settings() -> list[tuple[str, str]]:
    """The shipped turnserver.conf as (option, value) pairs, in order."""
    settings = []
    for line in (COTURN / "turnserver.conf").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            settings.append((key.strip(), value.strip()))
    return settings


def test_the_shipped_coturn_config_relays_udp_only_within_quotas() -> None:
    settings = dict(coturn_settings())
    for flag in ("use-auth-secret", "no-tcp-relay", "no-multicast-peers", "no-cli"):
        assert flag in settings, flag
    for flag in ("no-tls", "no-dtls"):
        assert flag in settings, flag
    # Nothing that opens loopback, no secret and no allowed peer: those are
    # each deployment's (start.sh adds them).
    for flag in ("allow-loopback-peers", "static-auth-secret", "allowed-peer-ip", "cert"):
        assert flag not in settings, flag
    for quota in ("user-quota", "total-quota", "max-bps"):
        assert int(settings[quota]) > 0, quota
    assert 0 < int(settings["stale-nonce"]) <= 3600
    assert 0 < int(settings["max-allocate-lifetime"]) <= 3600


def test_the_shipped_coturn_config_denies_every_private_and_local_network() -> None:
    ranges = []
    for key, value in coturn_settings():
        if key == "denied-peer-ip":
            first, _, last = value.partition("-")
            ranges.append((ipaddress.ip_address(first), ipaddress.ip_address(last or first)))
    # coturn reads a range starting at :: as one starting anywhere, in
    # either address family: it would deny every IPv4 peer too.
    assert ipaddress.ip_address("::") not in {first for first, _ in ranges}
    for network in map(ipaddress.ip_network, DENIED_NETWORKS):
        low, high = int(network[0]), int(network[-1])
        assert any(
            first.version == network.version and int(first) <= low and high <= int(last)
            for first, last in ranges
        ), f"{network} is not denied"


def yaml_documents(path: Path) -> list[Any]:
    """A YAML file's documents, read by the deploy tools' Python (yamllint
    brings PyYAML there; this venv has no type information for it)."""
    script = (
        "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))"
    )
    documents: list[Any] = json.loads(run(tool("python"), "-c", script, str(path)))
    return documents


def test_no_deploy_file_puts_the_turn_secret_on_a_command_line() -> None:
    for path in DEPLOY.rglob("*"):
        if path.is_file():
            assert "--static-auth-secret" not in path.read_text(errors="replace"), path


def test_compose_runs_coturn_with_the_shipped_config() -> None:
    (compose,) = yaml_documents(DEPLOY / "compose.yaml")
    coturn = compose["services"]["coturn"]
    assert coturn["entrypoint"] == ["/bin/sh", "/etc/coturn/start.sh"]
    assert "./coturn:/etc/coturn:ro" in coturn["volumes"]
    assert "/tmp" in coturn["tmpfs"]
    # "-n" would make coturn skip its config file.
    assert "-n" not in coturn["command"]
    assert not any("secret" in arg for arg in coturn["command"]), coturn["command"]
    assert coturn["environment"]["TURN_SECRET"].startswith("${TURN_SECRET:?")
    assert "TURN_ALLOWED_PEER_IP" in coturn["environment"]


def test_kubernetes_runs_coturn_with_the_shipped_config_and_the_secret_as_a_file() -> None:
    documents = {doc["kind"]: doc for doc in yaml_documents(DEPLOY / "k8s" / "coturn.yaml")}
    # The ConfigMap holds the shipped files exactly.
    data = documents["ConfigMap"]["data"]
    assert data == {
        "turnserver.conf": (COTURN / "turnserver.conf").read_text(),
        "start.sh": (COTURN / "start.sh").read_text(),
    }
    pod = documents["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"] == ["/bin/sh", "/etc/coturn/start.sh"]
    assert "-n" not in container["args"]
    assert not any("secret" in arg.lower() for arg in container["args"]), container["args"]
    env = {item["name"]: item for item in container["env"]}
    # The secret is a file, not an environment variable.
    assert not any("valueFrom" in item for item in container["env"]), container["env"]
    assert env["TURN_ALLOWED_PEER_IP"]["value"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert mounts["config"] == "/etc/coturn"
    assert volumes["config"]["configMap"]["name"] == documents["ConfigMap"]["metadata"]["name"]
    secret = volumes["turn-secret"]["secret"]
    assert secret["secretName"] == "voice-agent"
    (item,) = secret["items"]
    assert item["key"] == "turn-secret"
    assert env["TURN_SECRET_FILE"]["value"] == f"{mounts['turn-secret']}/{item['path']}"
    # The generated config, secret included, stays in memory.
    assert volumes["tmp"]["emptyDir"]["medium"] == "Memory"


# --- the image and compose: need podman ----------------------------------------


def podman_config(directory: Path) -> dict[str, str]:
    """The environment podman needs on hosts like CI's: runc (crun fails on
    its cgroups) and explicit ulimits at or under the hard limits (the
    defaults are higher than this host lets a container have)."""
    files, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    processes = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
    conf = directory / "containers.conf"
    conf.write_text(
        "[containers]\n"
        f'default_ulimits = ["nofile={files}:{files}", "nproc={processes}:{processes}"]\n'
        '[engine]\nruntime = "runc"\n'
    )
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    missing = [name for name in ("podman", "mmdebstrap", "runc") if shutil.which(name) is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (apt-get install podman mmdebstrap runc)")
    if os.geteuid() != 0:
        pytest.skip("needs root: rootful podman (the image build imports a bootstrapped base)")
    env = podman_config(tmp_path_factory.mktemp("podman"))
    probe = subprocess.run(
        ["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    if probe.returncode != 0:
        pytest.skip(f"podman cannot run here: {probe.stderr.strip()[-300:]}")
    yield env


@pytest.fixture(scope="module")
def image(podman: dict[str, str]) -> str:
    """The CPU image, built offline (make image: base, wheelhouse, build)."""
    run(
        "make",
        "--no-print-directory",
        "image",
        f"IMAGE={IMAGE}",
        # The venv running these tests (its pip downloads the wheelhouse).
        f"VENV={Path(sys.executable).parents[1]}",
        timeout=IMAGE_BUILD_TIMEOUT_S,
        env=podman,
    )
    return IMAGE


async def arun(*command: str, limit_s: float = 120, env: dict[str, str] | None = None) -> str:
    """``run`` off the event loop (a call may be live on it)."""
    return await asyncio.to_thread(run, *command, timeout=limit_s, env=env)


def base_image(podman: dict[str, str]) -> str:
    name = run("make", "--no-print-directory", "-s", "print-local-base", env=podman).strip()
    assert name.startswith("localhost/voice-agent-base:")
    return name


@contextlib.asynccontextmanager
async def container(podman: dict[str, str], *args: str) -> AsyncIterator[str]:
    name = f"voice-agent-test-{uuid.uuid4().hex[:8]}"
    await arun("podman", "run", "-d", "--name", name, *args, env=podman)
    try:
        yield name
    finally:
        await asyncio.to_thread(
            subprocess.run, ["podman", "rm", "-f", "-t", "5", name], env=podman, capture_output=True
        )


async def spoken_turn(client: RealtimeClient, http: aiohttp.ClientSession) -> dict[str, Any]:
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    done = client.wait_for_type("response.done")
    sent = await client.mic.play(np.concatenate((librivox("0930"), silence(0.3))), 16000)
    response: dict[str, Any] = (await asyncio.wait_for(done, 90))["response"]
    assert response["status"] == "completed", response.get("status_details")
    assert client.of_type("conversation.item.input_audio_transcription.completed")
    assert client.received.first_sound_after(sent) is not None, "no audible answer came back"
    return response


@pytest_asyncio.fixture
async def http_session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


@pytest.mark.e2e
@pytest.mark.container
@pytest.mark.models
@pytest.mark.slow
async def test_the_image_serves_a_real_call_with_host_networking(
    podman: dict[str, str], image: str, http_session: aiohttp.ClientSession
) -> None:
    http = http_session
    port = free_port()
    env = {
        "VOICE_AGENT_PORT": str(port),
        "VOICE_AGENT_API_KEYS": json.dumps([KEY]),
        # Loopback only: the test's media never leaves this machine.
        "VOICE_AGENT_ICE_HOST_ADDRESSES": '["127.0.0.1"]',
        "VOICE_AGENT_WORKERS": "0",
    }
    flags = [item for k, v in env.items() for item in ("-e", f"{k}={v}")]
    async with container(podman, "--network=host", *flags, image) as name:
        url = f"http://127.0.0.1:{port}"
        await wait_ready(http, url, timeout_s=READY_TIMEOUT_S)
        # Not root, and the image's own health check agrees.
        assert (await arun("podman", "exec", name, "id", "-u", env=podman)).strip() == "10001"
        await arun("podman", "healthcheck", "run", name, env=podman)
        # Listening on every interface: keys are required.
        async with http.post(url + "/v1/realtime/calls", data="v=0") as refused:
            assert refused.status == 401
        client = RealtimeClient(url, token=KEY)
        try:
            await spoken_turn(client, http)
        finally:
            await client.hangup(http)
        await arun("podman", "stop", "-t", "60", name, env=podman, limit_s=90)
        state = await arun("podman", "inspect", "--format", "{{.State.ExitCode}}", name, env=podman)
        assert state.strip() == "0"


@pytest.mark.e2e
@pytest.mark.container
@pytest.mark.models
@pytest.mark.slow
async def test_compose_relays_a_call_through_its_turn_server(
    podman: dict[str, str], image: str, http_session: aiohttp.ClientSession
) -> None:
    http = http_session
    compose = tool("podman-compose")
    port, turn_port = free_port(), free_port()
    relay_low = 40000 + turn_port % 20000
    env = {
        **podman,
        "VOICE_AGENT_IMAGE": image,
        # coturn from the same local Debian base (no registry here).
        "COTURN_IMAGE": await asyncio.to_thread(base_image, podman),
        "VOICE_AGENT_API_KEYS": json.dumps([KEY]),
        "TURN_SECRET": uuid.uuid4().hex,
        "VOICE_AGENT_PORT": str(port),
        "TURN_PORT": str(turn_port),
        "TURN_MIN_PORT": str(relay_low),
        "TURN_MAX_PORT": str(relay_low + 100),
        # Everything on loopback: coturn listens and relays there, and may
        # relay to the server's loopback host candidates (127.0.0.1 only:
        # the shipped deny list keeps the rest of loopback closed).
        "TURN_PUBLIC_HOST": "127.0.0.1",
        "TURN_LISTENING_IP": "127.0.0.1",
        "TURN_RELAY_IP": "127.0.0.1",
        "TURN_ALLOWED_PEER_IP": "127.0.0.1",
        "TURN_PEER_FLAG": "--allow-loopback-peers",
        "ICE_HOST_ADDRESSES": '["127.0.0.1"]',
    }
    project = ["-p", f"voice-agent-test-{uuid.uuid4().hex[:8]}", "-f", str(DEPLOY / "compose.yaml")]
    await arun(compose, *project, "up", "-d", env=env, limit_s=180)
    try:
        url = f"http://127.0.0.1:{port}"
        await wait_ready(http, url, timeout_s=READY_TIMEOUT_S)
        ice_servers = await fetch_ice_servers(http, url, token=KEY)
        assert any("turn:127.0.0.1" in str(s.urls) for s in ice_servers)
        client = RealtimeClient(url, ice_servers=ice_servers, token=KEY, relay_only=True)
        try:
            await spoken_turn(client, http)
            assert "typ host" not in client.pc.localDescription.sdp
            selected = client.selected_candidates()
            assert selected is not None and selected[0] == "relay", selected
        finally:
            await client.hangup(http)
    finally:
        await arun(compose, *project, "down", "-t", "10", env=env, limit_s=120)
