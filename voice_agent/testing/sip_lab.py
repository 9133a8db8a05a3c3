"""A telephone lab for the SIP gateway tests and bench/sip_cpu.py, all
inside one network namespace.

Addresses of its own on its loopback: the gateway (Kamailio + rtpengine,
``deploy/sip/run-gateway``), a phone (baresip, or SIPp for the malformed
cases) and the service (``voice-agent serve``, with a scripted LLM served
from this process on a socket made inside the namespace); for the
gateway's defences, four more callers (SIPp): two more trunks, a stranger
and a flooder. The phone itself is in ``sip_phone.py``.

The gateway's scripts (``deploy/sip``) and the SIPp scenarios
(``tests/sip``) are read from the source checkout: without them
``missing()`` says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import importlib.util
import os
import re
import shutil
import signal
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import aiohttp

from voice_agent.testing.checkout import CHECKOUT
from voice_agent.testing.netns import NetworkNamespace, missing_for_namespaces
from voice_agent.testing.scripted_llm import ScriptedLlmServer, scripted_llm_server

GATEWAY_SCRIPT = CHECKOUT / "deploy" / "sip" / "run-gateway"
SCENARIOS = CHECKOUT / "tests" / "sip"
GATEWAY, PHONE, SERVICE = "10.77.0.1", "10.77.0.2", "10.77.0.3"
TRUNK_B, STRANGER, FLOODER, TRUNK_C = "10.77.0.4", "10.77.0.5", "10.77.0.6", "10.77.0.7"
SIP_PORT = 5060
SERVICE_PORT = 8080
API_KEY = "sk-sip-lab-key-0123"
NUMBER = "5551234"
PHONE_RATE = 8000
TOOLS = {
    "kamailio": "kamailio",
    "rtpengine": "rtpengine-daemon",
    "baresip": "baresip-core",
    "sipp": "sip-tester",
}
KAMAILIO_PYTHON = Path("/usr/lib/x86_64-linux-gnu/kamailio/modules/app_python3.so")


def missing() -> str | None:
    """Why the lab cannot run here (named), or None."""
    if (reason := missing_for_namespaces()) is not None:
        return reason
    if not (GATEWAY_SCRIPT.exists() and SCENARIOS.is_dir()):
        return f"needs the source checkout's deploy/sip and tests/sip (not at {CHECKOUT})"
    absent = [package for tool, package in TOOLS.items() if shutil.which(tool) is None]
    if not KAMAILIO_PYTHON.exists():
        absent.append("kamailio-python3-modules")
    if absent:
        return "needs the Debian packages " + ", ".join(absent)
    return None


def load_ng() -> ModuleType:
    """The gateway's rtpengine client (deploy/sip/ng.py; not a package)."""
    spec = importlib.util.spec_from_file_location("sip_ng", GATEWAY_SCRIPT.parent / "ng.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class LogWatch:
    """Lines of a process's output, kept, with waiting for one that matches."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lines: list[str] = []
        self._changed = asyncio.Event()

    async def follow(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.lines.append(line.decode(errors="replace").rstrip())
            self._changed.set()
            self._changed = asyncio.Event()

    def matching(self, pattern: str) -> list[re.Match[str]]:
        found = (re.search(pattern, line) for line in self.lines)
        return [match for match in found if match is not None]

    async def wait_for(self, pattern: str, within_s: float, count: int = 1) -> list[re.Match[str]]:
        async with asyncio.timeout(within_s):
            while len(found := self.matching(pattern)) < count:
                await self._changed.wait()
        return found

    def tail(self, lines: int = 40) -> str:
        return "\n".join([line for line in self.lines if line.strip()][-lines:])


@dataclass
class Process:
    """A process the lab started, and its output as it comes."""

    process: asyncio.subprocess.Process
    log: LogWatch
    reader: asyncio.Task[None]

    async def stop(self, within_s: float = 10.0) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(within_s):
                    await self.process.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.process.kill()
                await self.process.wait()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self.reader


async def start(namespace: NetworkNamespace, name: str, *args: str, **env: str) -> Process:
    """``args`` run inside ``namespace``, with ``env`` added to this process's
    environment; its output (stdout and stderr) followed under ``name``."""
    process = await asyncio.create_subprocess_exec(
        *namespace.command(*args),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
    )
    log = LogWatch(name)
    assert process.stdout is not None
    reader = asyncio.create_task(log.follow(process.stdout), name=f"log-{name}")
    return Process(process, log, reader)


@dataclass
class Gateway:
    """One gateway (Kamailio + rtpengine): its SIP and rtpengine control ports."""

    sip_port: int
    ng_port: int
    process: Process


@dataclass
class SippRun:
    """A SIPp run's exit code, its report (with the gateway's log) and its
    call counts (a call: one pass through the scenario)."""

    code: int
    output: str
    successful: int
    failed: int


@dataclass
class SipLab:
    """The lab as it runs: the namespace, the scripted LLM the service talks
    to, the service and the gateway."""

    namespace: NetworkNamespace
    workdir: Path
    llm: ScriptedLlmServer
    service: Process
    gateway: Gateway
    http: aiohttp.ClientSession
    ng: ModuleType = field(default_factory=load_ng)

    @property
    def service_url(self) -> str:
        return f"http://{SERVICE}:{SERVICE_PORT}"

    async def stats(self) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        async with self.http.get(f"{self.service_url}/v1/stats", headers=headers) as response:
            body: dict[str, Any] = await response.json()
            return body

    def media_calls(self, gateway: Gateway | None = None) -> list[Any]:
        """The calls rtpengine is relaying now."""
        port = (gateway or self.gateway).ng_port
        reply = self.namespace.call(
            self.ng.command, ("127.0.0.1", port), {"command": "list", "limit": 100}
        )
        calls: list[Any] = reply.get("calls", [])
        return calls

    async def wait_until_idle(self, within_s: float = 10.0, gateway: Gateway | None = None) -> None:
        """Until no call is left: none in the service, none in the gateway's
        rtpengine. (Both are other processes' state, with nothing to wait on
        but asking.)"""
        async with asyncio.timeout(within_s):
            while (await self.stats())["calls"] or self.media_calls(gateway):  # noqa: ASYNC110
                await asyncio.sleep(0.2)

    async def sipp(self, scenario: str, *args: str, port: int = SIP_PORT) -> tuple[int, str]:
        """Run a SIPp scenario (tests/sip/) against the gateway: exit code, output."""
        run = await self.sipp_run(scenario, *args, port=port)
        return run.code, run.output

    async def sipp_run(
        self,
        scenario: str,
        *args: str,
        port: int = SIP_PORT,
        source: str = PHONE,
        local_port: int = 5080,
        calls: int = 1,
        gateway: Gateway | None = None,
    ) -> SippRun:
        """Run a SIPp scenario (tests/sip/) from ``source`` against a gateway."""
        name = f"{scenario}-{source}-{local_port}"
        errors, stats = self.workdir / f"{name}.errors", self.workdir / f"{name}.csv"
        for path in (errors, stats):
            path.unlink(missing_ok=True)
        process = await start(
            self.namespace,
            "sipp",
            "sipp",
            f"{GATEWAY}:{port}",
            "-sf",
            str(SCENARIOS / scenario),
            "-i",
            source,
            "-p",
            str(local_port),
            "-m",
            str(calls),
            "-s",
            NUMBER,
            "-timeout",
            "20s",
            "-timeout_error",
            "-nostdin",
            "-trace_err",
            "-error_file",
            str(errors),
            "-trace_stat",
            "-stf",
            str(stats),
            *args,
        )
        async with asyncio.timeout(30):
            code = await process.process.wait()
        await process.stop()
        report = process.log.tail() + (errors.read_text() if errors.exists() else "")
        gateway_log = (gateway or self.gateway).process.log.tail(15)
        counts = {"SuccessfulCall(C)": "0", "FailedCall(C)": "0"}
        if stats.exists():
            with stats.open() as handle:
                rows = list(csv.reader(handle, delimiter=";"))
            if len(rows) > 1:
                counts = dict(zip(rows[0], rows[-1], strict=False))
        return SippRun(
            code,
            f"{report}\ngateway log:\n{gateway_log}",
            int(counts["SuccessfulCall(C)"]),
            int(counts["FailedCall(C)"]),
        )


async def start_gateway(
    namespace: NetworkNamespace,
    workdir: Path,
    service_url: str,
    sip_port: int = SIP_PORT,
    ng_port: int = 2223,
    rtp_ports: tuple[int, int] = (30000, 30199),
    settings: Mapping[str, str] | None = None,
) -> Gateway:
    """A gateway; ``settings``: more of run-gateway's variables (its defences)."""
    process = await start(
        namespace,
        f"gateway-{sip_port}",
        str(GATEWAY_SCRIPT),
        SIP_ADDRESS=GATEWAY,
        SIP_PORT=str(sip_port),
        RTPENGINE_NG=f"127.0.0.1:{ng_port}",
        RTP_PORT_MIN=str(rtp_ports[0]),
        RTP_PORT_MAX=str(rtp_ports[1]),
        VOICE_AGENT_URL=service_url,
        VOICE_AGENT_API_KEY=API_KEY,
        GATEWAY_RUN_DIR=str(workdir / f"gateway-{sip_port}"),
        GATEWAY_LOG_LEVEL="2",
        KAMAILIO_CHILDREN="4",
        **(settings or {}),
    )
    gateway = Gateway(sip_port, ng_port, process)
    # Ready: Kamailio has its SIP socket, rtpengine answers its control socket.
    await process.log.wait_for(rf"udp: {re.escape(GATEWAY)} .*:{sip_port}", 20)
    ng = load_ng()
    async with asyncio.timeout(20):
        while True:
            try:
                namespace.call(ng.command, ("127.0.0.1", ng_port), {"command": "ping"})
                break
            except (OSError, ng.NgError):
                await asyncio.sleep(0.2)
    return gateway


async def start_service(namespace: NetworkNamespace, llm_url: str, *args: str) -> Process:
    """``voice-agent serve`` at SERVICE in the namespace, its LLM at ``llm_url``."""
    return await start(
        namespace,
        "service",
        sys.executable,
        "-m",
        "voice_agent",
        "serve",
        "--host",
        SERVICE,
        "--port",
        str(SERVICE_PORT),
        "--api-keys",
        API_KEY,
        "--ice-host-addresses",
        SERVICE,
        "--llm-base-url",
        f"{llm_url}/v1",
        "--log-format",
        "text",
        *args,
    )


async def wait_ready(http: aiohttp.ClientSession, url: str, service: Process) -> None:
    """Until the service answers ``/readyz``; RuntimeError if it exits first."""
    async with asyncio.timeout(120):
        while True:
            if service.process.returncode is not None:
                raise RuntimeError(f"the service exited:\n{service.log.tail()}")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(f"{url}/readyz") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.3)


@asynccontextmanager
async def sip_lab(
    workdir: Path, *service_args: str, gateway_settings: Mapping[str, str] | None = None
) -> AsyncIterator[SipLab]:
    """The lab, running, with ``service_args`` for the service and
    ``gateway_settings`` for the gateway; on the way out, everything in the
    namespace stopped and the namespace removed (AssertionError if a process
    was left running there)."""
    namespace = NetworkNamespace(
        f"va-sip-{os.getpid()}", [GATEWAY, PHONE, SERVICE, TRUNK_B, STRANGER, FLOODER, TRUNK_C]
    )
    namespace.create()
    processes: list[Process] = []
    leftover: list[int] = []
    try:
        async with (
            scripted_llm_server(namespace.listener(SERVICE)) as llm,
            aiohttp.ClientSession(connector=namespace.connector()) as http,
        ):
            service = await start_service(namespace, llm.url, *service_args)
            processes.append(service)
            url = f"http://{SERVICE}:{SERVICE_PORT}"
            await wait_ready(http, url, service)
            gateway = await start_gateway(namespace, workdir, url, settings=gateway_settings)
            processes.append(gateway.process)
            yield SipLab(namespace, workdir, llm, service, gateway, http)
    finally:
        for process in reversed(processes):
            await process.stop()
        # Whatever was left behind in the namespace goes with it.
        leftover = namespace.pids()
        for pid in leftover:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        namespace.delete()
    # Stopping the gateway and the service stops everything they started.
    assert not leftover, f"processes left running in the namespace: {leftover}"
