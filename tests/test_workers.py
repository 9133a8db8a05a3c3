"""``voice-agent serve --workers 2``: one port, two media worker processes,
the models shared in the parent. Real server processes, real aiortc callers,
real models."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families
from yarl import URL

from tests.conftest import test_settings as settings_for_test
from tests.silent_websocket import SilentWebSocket, let_go_of
from tests.test_signaling import mutate, real_offer
from tests.test_slow_clients import store_and_retrieve
from voice_agent.backends.llm.http_client import HttpLlmConfig
from voice_agent.client import RealtimeClient
from voice_agent.cpu import available_cores, media_workers_for
from voice_agent.engine import SharedModelLinks
from voice_agent.server.worker_pool import same_code_interpreter
from voice_agent.server.worker_protocol import WorkerConfig, WorkerLinks
from voice_agent.testing.audio_data import heard_as_its_own, librivox, silence
from voice_agent.testing.serving import start_server, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CALLS = "/v1/realtime/calls"


class WorkersServer:
    def __init__(self, process: asyncio.subprocess.Process, url: str) -> None:
        self.process = process
        self.url = url

    async def json(
        self, http: aiohttp.ClientSession, path: str, key: str | None = None
    ) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with http.get(self.url + path, headers=headers) as response:
            body: dict[str, Any] = await response.json()
            return body


@pytest_asyncio.fixture
async def workers_server(http: aiohttp.ClientSession) -> AsyncIterator[WorkersServer]:
    process, url = await start_server(
        *("--workers", "2", "--max-calls", "3", "--drain-timeout-s", "1", "--debug-endpoints")
    )
    server = WorkersServer(process, url)
    try:
        await wait_ready(http, url, timeout_s=240)
        yield server
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                await process.wait()


def location(client: RealtimeClient) -> str:
    assert client.location is not None
    return client.location


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


async def spoken_turn(
    server: WorkersServer, http: aiohttp.ClientSession, clip: str
) -> tuple[RealtimeClient, str, dict[str, Any], float | None]:
    client = RealtimeClient(server.url)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    done = client.wait_for_type("response.done")
    sent = await client.mic.play(np.concatenate((librivox(clip), silence(0.3))), 16000)
    response = (await asyncio.wait_for(done, 90))["response"]
    (heard,) = client.of_type("conversation.item.input_audio_transcription.completed")
    return client, heard["transcript"], response, client.received.first_sound_after(sent)


async def test_three_callers_over_two_workers_are_all_answered_and_routed_to_their_owner(
    workers_server: WorkersServer, http: aiohttp.ClientSession
) -> None:
    server = workers_server
    ready = await server.json(http, "/readyz")
    assert [w["up"] for w in ready["workers"]] == [True, True]
    clips = ["0930", "0880", "0890"]
    results = await asyncio.gather(*(spoken_turn(server, http, clip) for clip in clips))
    for clip, (_, transcript, response, first_sound) in zip(clips, results, strict=True):
        assert heard_as_its_own(clip, transcript, clips), (clip, transcript)
        assert response["status"] == "completed", response.get("status_details")
        assert response["output"][0]["content"][0]["transcript"].strip()
        assert first_sound is not None, "no audible answer came back"

    # The least-loaded worker took each call: both workers serve calls.
    clients = [r[0] for r in results]
    owners = sorted(location(c).split("/")[-1].split("_")[1] for c in clients)
    assert owners in (["w0", "w0", "w1"], ["w0", "w1", "w1"])
    stats = await server.json(http, "/v1/stats")
    assert stats["calls"] == 3 and sorted(w["calls"] for w in stats["workers"]) == [1, 2]
    # The models are the parent's: one STT worker saw every caller's turn
    # (finals, or speculative transcripts at the pause; one final is the warm-up).
    requests = stats["stt"]["requests"]
    assert requests["final"] + requests["partial"] >= 1 + 3
    assert len(stats["stt"]["sessions"]) == 3
    assert stats["pacing"]["frames"] > 0

    # Capacity counts every worker's calls: a fourth caller is refused up front.
    extra = RealtimeClient(server.url)
    with pytest.raises(RuntimeError, match="503"):
        await extra.connect(http)
    await extra.hangup()

    # A key press a SIP gateway reports reaches the call's own worker.
    for client in clients:
        async with http.post(server.url + location(client) + "/dtmf", json={"digits": "7"}) as key:
            assert key.status == 200 and await key.json() == {"digits": "7"}
        await asyncio.wait_for(client.wait_for(lambda e: e.get("event") == "7"), 5)
    async with http.post(
        server.url + CALLS + "/rtc_w7_nosuchworker/dtmf", json={"digits": "7"}
    ) as key:
        assert key.status == 404

    # A DELETE reaches the worker that owns the call, wherever it is.
    for client in clients:
        async with http.delete(server.url + location(client)) as deleted:
            assert deleted.status == 204
        async with http.delete(server.url + location(client)) as deleted:
            assert deleted.status == 404
        await client.hangup()
    async with asyncio.timeout(10):
        while True:
            if (await server.json(http, "/v1/stats"))["calls"] == 0:
                break
            await asyncio.sleep(0.1)  # the workers' call streams reach the front
    async with http.delete(server.url + CALLS + "/rtc_w7_nosuchworker") as deleted:
        assert deleted.status == 404


async def test_a_worker_that_dies_is_restarted_and_the_other_workers_calls_go_on(
    workers_server: WorkersServer, http: aiohttp.ClientSession
) -> None:
    server = workers_server
    first = RealtimeClient(server.url)
    await first.connect(http)
    second = RealtimeClient(server.url)
    await second.connect(http)
    by_worker = {location(c).split("_")[1]: c for c in (first, second)}
    assert set(by_worker) == {"w0", "w1"}
    workers = (await server.json(http, "/readyz"))["workers"]
    victim_pid = workers[0]["pid"]
    os.kill(victim_pid, signal.SIGKILL)

    # The other worker's caller still has a whole conversation turn.
    survivor = by_worker["w1"]
    done = survivor.wait_for_type("response.done")
    await survivor.mic.play(np.concatenate((librivox("0930"), silence(0.3))), 16000)
    assert (await asyncio.wait_for(done, 90))["response"]["status"] == "completed"

    # The dead worker comes back (a new process), and takes calls again.
    async with asyncio.timeout(60):
        while True:
            workers = (await server.json(http, "/readyz"))["workers"]
            if workers[0]["up"] and workers[0]["pid"] != victim_pid:
                break
            await asyncio.sleep(0.2)  # another process restarting on its own backoff
    assert workers[0]["restarts"] == 1 and not alive(victim_pid)
    # Its call is gone with it: the front forgot it.
    async with http.delete(server.url + location(by_worker["w0"])) as deleted:
        assert deleted.status == 404
    again = RealtimeClient(server.url)
    await again.connect(http)
    assert "_w0_" in location(again)
    for client in (first, second, again):
        await client.hangup(http)


async def test_a_worker_that_hangs_does_not_hold_the_clients_request(
    workers_server: WorkersServer, http: aiohttp.ClientSession
) -> None:
    server = workers_server
    client = RealtimeClient(server.url)
    await client.connect(http)
    index = int(location(client).split("_w")[1].split("_")[0])
    pid = (await server.json(http, "/readyz"))["workers"][index]["pid"]
    os.kill(pid, signal.SIGSTOP)  # alive, connected, never answering
    try:
        async with asyncio.timeout(30):
            async with http.delete(server.url + location(client)) as deleted:
                assert deleted.status == 503, await deleted.text()
                assert (await deleted.json())["error"]["code"] == "workers_unavailable"
    finally:
        os.kill(pid, signal.SIGCONT)
    await client.hangup(http)


def descendants(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children] + [d for c in children for d in descendants(int(c))]


def test_the_media_workers_follow_the_capacity_and_one_core_runs_one_process() -> None:
    assert [media_workers_for(calls, 2) for calls in (1, 5, 6, 10, 40)] == [1, 1, 2, 2, 2]
    assert media_workers_for(40, 16) == 8 and media_workers_for(200, 16) == 16
    assert media_workers_for(3, 1) == 0


@pytest.mark.skipif(available_cores() < 2, reason="needs two cores")
@pytest.mark.parametrize(("max_calls", "workers"), [("5", 1), ("6", 2)])
async def test_without_workers_set_the_capacity_chooses_them(
    http: aiohttp.ClientSession, max_calls: str, workers: int
) -> None:
    """Five calls a media worker: a capacity of 5 gets one, of 6 two, each
    up and answering (on two cores, as the CI machine has)."""
    two_cores = set(sorted(os.sched_getaffinity(0))[:2])
    process, url = await start_server("--max-calls", max_calls, cpus=two_cores)
    server = WorkersServer(process, url)
    try:
        await wait_ready(http, url, timeout_s=240)
        ready = await server.json(http, "/readyz")
        assert [w["up"] for w in ready["workers"]] == [True] * workers
        assert len(descendants(process.pid)) == workers + 1  # and llama-server
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await process.wait()


async def test_the_fronts_debug_counts_gather_each_workers_own(
    workers_server: WorkersServer, http: aiohttp.ClientSession
) -> None:
    """bench/soak.py reads each process of the service through the front:
    a call's objects live in its worker, and a worker that is down says so."""
    server = workers_server
    pids = [w["pid"] for w in (await server.json(http, "/readyz"))["workers"]]
    client = RealtimeClient(server.url)
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    owner = int(location(client).split("/")[-1].split("_")[1].removeprefix("w"))
    during = await server.json(http, "/debug/memory?types=1")
    assert during["calls"] == 1 and during["objects"]["Call"] == 0  # the front holds none
    assert [w["pid"] for w in during["workers"]] == pids
    for worker in during["workers"]:
        assert worker["index"] in (0, 1)
        mine = worker["index"] == owner
        assert worker["calls"] == worker["objects"]["Call"] == int(mine), worker["index"]
        assert worker["objects"]["RTCPeerConnection"] == int(mine)
        assert worker["types"]["voice_agent.server.calls.CallRegistry"] == 1
    await client.hangup(http)
    async with asyncio.timeout(10):
        while True:
            if not (await server.json(http, "/debug/memory"))["calls"]:
                break
            await asyncio.sleep(0.1)  # the worker's call stream reaches the front
    after = await server.json(http, "/debug/memory")
    assert [w["objects"]["Call"] for w in after["workers"]] == [0, 0]

    os.kill(pids[1], signal.SIGKILL)
    async with asyncio.timeout(10):
        while True:
            if "error" in (await server.json(http, "/debug/memory"))["workers"][1]:
                break
            await asyncio.sleep(0.05)  # the supervisor sees it exit
    gathered = await server.json(http, "/debug/memory")
    assert gathered["workers"][1] == {"index": 1, "pid": pids[1], "error": "down"}
    assert gathered["workers"][0]["objects"]["Call"] == 0


def loaded_libraries(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


async def test_the_front_leaves_the_media_stack_to_its_workers(
    workers_server: WorkersServer, http: aiohttp.ClientSession
) -> None:
    """The front only forwards offers: it never loads aiortc or PyAV (about
    35 MB of a process), which its workers run every call on."""
    server = workers_server
    client = RealtimeClient(server.url)
    await client.connect(http)  # an offer checked and forwarded, its call answered
    await asyncio.wait_for(client.wait_for_type("session.created"), 10)
    front = loaded_libraries(server.process.pid)
    assert "/av.libs/" not in front and "/pylibsrtp/" not in front
    for worker in (await server.json(http, "/readyz"))["workers"]:
        mapped = loaded_libraries(worker["pid"])
        assert "/av.libs/" in mapped and "/pylibsrtp/" in mapped
    await client.hangup(http)

    # An offer only aiortc's parser refuses: the worker refuses it, the
    # front relays the refusal, and the worker's slot is free again.
    pc, sdp = await real_offer()
    await pc.close()
    headers = {"Content-Type": "application/sdp"}
    async with http.post(
        server.url + CALLS, data=mutate(sdp, "a=rtcp:", "a=rtcp"), headers=headers
    ) as refused:
        assert refused.status == 400
        assert (await refused.json())["error"]["code"] == "invalid_sdp"
        assert "could not be parsed" in (await refused.json())["error"]["message"]
    async with asyncio.timeout(10):
        while True:
            if (await server.json(http, "/readyz"))["load"] == 0:
                break
            await asyncio.sleep(0.1)  # the hang-up reaches the front


async def test_sigterm_stops_the_front_every_worker_and_the_llm(
    workers_server: WorkersServer, http: aiohttp.ClientSession
) -> None:
    server = workers_server
    client = RealtimeClient(server.url)
    await client.connect(http)
    processes = descendants(server.process.pid)
    assert len(processes) >= 3  # two workers and the embedded llama-server
    server.process.send_signal(signal.SIGTERM)
    async with asyncio.timeout(30):
        assert await server.process.wait() == 0
    assert not [pid for pid in processes if alive(pid)]
    await client.hangup()


async def test_the_front_authenticates_and_a_secret_binds_the_session_on_the_worker(
    http: aiohttp.ClientSession,
) -> None:
    key = "sk-front-key-0123456"
    process, url = await start_server("--workers", "2", "--auth", "required", "--api-keys", key)
    server = WorkersServer(process, url)
    try:
        await wait_ready(http, url, timeout_s=240)
        anonymous = RealtimeClient(url)
        with pytest.raises(RuntimeError, match="401"):
            await anonymous.connect(http)
        await anonymous.hangup()
        headers = {"Authorization": f"Bearer {key}"}
        body = {"session": {"instructions": "Answer in French."}}
        async with http.post(url + "/v1/realtime/client_secrets", json=body, headers=headers) as r:
            secret = (await r.json())["value"]
        # An offer only the worker's aiortc parse refuses: the front has spent
        # the secret by then, and gives it back with the refusal.
        pc, sdp = await real_offer()
        await pc.close()
        bad = {"Content-Type": "application/sdp", "Authorization": f"Bearer {secret}"}
        async with http.post(
            url + CALLS, data=mutate(sdp, "a=rtcp:", "a=rtcp"), headers=bad
        ) as refused:
            assert refused.status == 400
            assert (await refused.json())["error"]["code"] == "invalid_sdp"
        client = RealtimeClient(url, token=secret)  # the same secret, a good offer
        await client.connect(http)
        created = await asyncio.wait_for(client.wait_for_type("session.created"), 10)
        assert created["session"]["instructions"] == "Answer in French."
        assert "_w" in location(client)
        stats = await server.json(http, "/v1/stats", key)
        assert stats["auth"]["refused"]["unauthorized"] == 1
        assert sum(stats["auth"]["calls_by_key"].values()) == 1
        await client.hangup(http)
        # A call made used it up.
        again = RealtimeClient(url, token=secret)
        with pytest.raises(RuntimeError, match="401"):
            await again.connect(http)
        await again.hangup()
    finally:
        process.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await process.wait()


async def test_a_websocket_session_through_the_front_is_served_by_a_worker(
    workers_server: WorkersServer, http: aiohttp.ClientSession
) -> None:
    server = workers_server
    url = server.url.replace("http://", "ws://") + "/v1/realtime"
    async with http.ws_connect(url, protocols=("realtime",)) as ws:
        first = await asyncio.wait_for(ws.receive_json(), 10)
        assert first["type"] == "session.created"
        stats = await server.json(http, "/v1/stats")
        assert stats["calls"] == 1 and sorted(w["calls"] for w in stats["workers"]) == [0, 1]
        text = {"type": "input_text", "text": "Say hello."}
        message = {"type": "message", "role": "user", "content": [text]}
        await ws.send_json({"type": "conversation.item.create", "item": message})
        await ws.send_json({"type": "response.create"})
        audio_deltas = 0
        async with asyncio.timeout(60):
            while True:
                event = await ws.receive_json()
                audio_deltas += event["type"] == "response.output_audio.delta"
                if event["type"] == "response.done":
                    break
        assert event["response"]["status"] == "completed" and audio_deltas > 10
    # /metrics merges the front's and every worker's, labelled by process.
    async with http.get(server.url + "/metrics") as response:
        families = {f.name: f for f in text_string_to_metric_families(await response.text())}
    completed = [
        s
        for s in families["voice_agent_responses"].samples
        if s.name.endswith("_total") and s.labels["status"] == "completed"
    ]
    assert [s.labels["process"] for s in completed if s.value == 1] in (["worker-0"], ["worker-1"])
    memory = {s.labels["process"] for s in families["process_resident_memory_bytes"].samples}
    assert memory == {"front", "worker-0", "worker-1"}
    async with asyncio.timeout(10):
        while True:
            if (await server.json(http, "/v1/stats"))["calls"] == 0:
                break
            await asyncio.sleep(0.1)  # the worker's call stream reaches the front


async def test_a_websocket_client_that_never_reads_is_let_go_of_by_the_front(
    workers_server: WorkersServer, http: aiohttp.ClientSession
) -> None:
    server = workers_server
    client = await SilentWebSocket.connect(server.url)
    try:
        for event in store_and_retrieve("item_large"):  # ~24 MB asked for, none read
            if not await client.send(event):
                break

        async def keep_sending() -> None:
            # As a gateway appending audio does: never silent long enough
            # for the heartbeat to end the connection.
            for _ in range(240):
                if not await client.send({"type": "input_audio_buffer.clear"}, timeout_s=1):
                    return
                await asyncio.sleep(0.5)

        sending = asyncio.create_task(keep_sending())
        try:
            assert await let_go_of(server.process.pid, client.local_port, within_s=60)
        finally:
            sending.cancel()
    finally:
        client.close()
    async with asyncio.timeout(10):
        while True:
            if (await server.json(http, "/v1/stats"))["calls"] == 0:
                break
            await asyncio.sleep(0.1)  # the worker's call stream reaches the front
    # The worker, told by the front, records why the call ended.
    async with http.get(server.url + "/metrics") as response:
        families = {f.name: f for f in text_string_to_metric_families(await response.text())}
    ended = {
        s.labels["outcome"]: s.value
        for s in families["voice_agent_calls_ended"].samples
        if s.name.endswith("_total") and s.value
    }
    assert ended == {"slow_client": 1}, ended


async def test_a_call_id_that_is_a_path_reaches_nothing_else_on_a_worker(
    workers_server: WorkersServer, http: aiohttp.ClientSession
) -> None:
    # aiohttp decodes %2F inside the id; put into a worker's URL as it was,
    # ".." would climb to the worker's private routes, /internal/drain among them.
    server = workers_server
    for worker in (0, 1):
        climb = f"rtc_w{worker}_x%2F..%2F..%2F..%2F..%2Finternal%2Fdrain%3Fx%3D"
        for method, path, body in (
            ("POST", f"{climb}/hold", {"held": True}),
            ("POST", f"{climb}/dtmf", {"digits": "1"}),
            ("DELETE", climb, None),
            ("GET", climb, None),
        ):
            target = URL(f"{server.url}{CALLS}/{path}", encoded=True)
            async with http.request(method, target, json=body) as response:
                assert response.status == 404, (method, path, await response.text())
    # A plain GET where a WebSocket upgrade belongs: refused before any
    # worker makes a call for it.
    async with http.get(server.url + "/v1/realtime") as response:
        assert response.status == 400
    # Neither worker drained: a session still opens on each.
    url = server.url.replace("http://", "ws://") + "/v1/realtime"
    async with (
        http.ws_connect(url, protocols=("realtime",)) as first,
        http.ws_connect(url, protocols=("realtime",)) as second,
    ):
        for ws in (first, second):
            assert (await asyncio.wait_for(ws.receive_json(), 10))["type"] == "session.created"
        stats = await server.json(http, "/v1/stats")
        assert sorted(w["calls"] for w in stats["workers"]) == [1, 1]


def runtime_dirs(parent: Path) -> list[Path]:
    return list(parent.glob("voice-agent-*"))


async def test_a_front_killed_outright_leaves_its_sockets_and_the_next_front_removes_them(
    http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    # SIGKILL (the OOM killer, a container stopped hard) gives the front no
    # chance to remove its directory of Unix sockets; the next one does.
    env = {"TMPDIR": str(tmp_path)}
    first, url = await start_server("--workers", "2", env=env, own_process_group=True)
    try:
        await wait_ready(http, url, timeout_s=240)
        (left,) = runtime_dirs(tmp_path)
        assert (left / "speech.sock").exists()
        processes = descendants(first.pid)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        await first.wait()
    for pid in processes:  # the whole group went with it
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert left.is_dir()
    second, url = await start_server("--workers", "2", env=env)
    try:
        await wait_ready(http, url, timeout_s=240)
        assert not left.exists()
        (mine,) = runtime_dirs(tmp_path)
    finally:
        second.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            await second.wait()
    assert not mine.exists()


def in_group(group: int) -> list[int]:
    """The live processes of process group ``group``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == group and fields[0] != "Z":
                found.append(int(stat.parent.name))
    return found


async def test_workers_started_ahead_leave_with_a_front_whose_models_fail(
    tmp_path: Path,
) -> None:
    # The workers start importing before the models load; a voice that is
    # not there fails the start-up after them, and they must not outlive it.
    env = {"TMPDIR": str(tmp_path)}
    front, _ = await start_server(
        "--workers", "2", "--tts-voice", str(tmp_path / "no-such-voice.onnx"),
        env=env, own_process_group=True,
    )  # fmt: skip
    workers_seen: set[int] = set()
    for _ in range(200):  # a test's bounded look while the front loads Whisper
        workers_seen |= {pid for pid in in_group(front.pid) if is_worker(pid)}
        if len(workers_seen) == 2 or front.returncode is not None:
            break
        await asyncio.sleep(0.02)
    assert len(workers_seen) == 2  # started before the voice was found missing
    async with asyncio.timeout(120):
        assert await front.wait() != 0
    assert not in_group(front.pid)  # the front waited for each worker it started
    # llama-server, started while the models loaded, leads its own group.
    assert not started_with(env)
    assert not runtime_dirs(tmp_path)


def started_with(env: dict[str, str]) -> list[int]:
    """Live processes whose environment holds ``env`` (a test's own marker,
    inherited by every process its server starts)."""
    marker = [f"{name}={value}".encode() for name, value in env.items()]
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        with contextlib.suppress(OSError):
            if all(m in environ.read_bytes().split(b"\0") for m in marker):
                found.append(int(environ.parent.name))
    return found


def is_worker(pid: int) -> bool:
    with contextlib.suppress(OSError):
        return b"voice_agent.server.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    return False


async def start_worker(
    tmp_path: Path,
) -> tuple[asyncio.subprocess.Process, WorkerConfig]:
    """A media worker process as the front starts one, sent its first line
    (who it is, the settings) and not yet its links."""
    interpreter, env = same_code_interpreter()
    worker = await asyncio.create_subprocess_exec(
        *interpreter, "-m", "voice_agent.server.worker",
        env=env, stdin=PIPE, stdout=PIPE, stderr=PIPE,
    )  # fmt: skip
    settings = settings_for_test(log_format="json", turn_detection="semantic")
    config = WorkerConfig(0, str(tmp_path / "worker-0.sock"), settings.model_dump(mode="json"))
    assert worker.stdin is not None
    worker.stdin.write((json.dumps(asdict(config)) + "\n").encode())
    await worker.stdin.drain()
    return worker, config


def listening(socket: str) -> bool:
    """Whether the worker made its socket (it does once it has its links)."""
    return os.path.exists(socket)


async def logged(worker: asyncio.subprocess.Process, message: str) -> dict[str, Any]:
    """The worker's first log record with this message (JSON on stderr)."""
    assert worker.stderr is not None
    async with asyncio.timeout(120):
        while line := await worker.stderr.readline():
            with contextlib.suppress(ValueError):
                record: dict[str, Any] = json.loads(line)
                if record.get("msg") == message:
                    return record
    raise AssertionError(f"the worker ended without logging {message!r}")


async def test_a_worker_loads_its_own_models_before_its_links_come(tmp_path: Path) -> None:
    # Its VAD and end-of-turn model load while the front loads STT, TTS and
    # the LLM: on the first line alone, with the links still to come.
    worker, config = await start_worker(tmp_path)
    try:
        loaded = await logged(worker, "turn model loaded")
        assert loaded["worker"] == 0
        assert not listening(config.socket)  # not listening without its links
        links = SharedModelLinks(
            speech_socket=str(tmp_path / "speech.sock"),  # asked only when a call speaks
            llm=asdict(HttpLlmConfig(base_url="http://127.0.0.1:9/v1", api_key=None, model="m")),
            tts_sample_rate=22_050,
            partial_interval_ms=0,
            prefill=False,
            model_name="m",
            voice_name="v",
        )
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write((json.dumps(asdict(WorkerLinks(asdict(links), 3))) + "\n").encode())
        async with asyncio.timeout(60):
            assert await worker.stdout.readline() == b"ready\n"
        assert listening(config.socket)
        worker.stdin.close()  # the parent gone: the worker closes and leaves
        async with asyncio.timeout(30):
            assert await worker.wait() == 0
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()


@pytest.mark.parametrize("how", ["parent gone", "SIGTERM"])
async def test_a_worker_stopped_while_it_loads_exits_cleanly(tmp_path: Path, how: str) -> None:
    worker, config = await start_worker(tmp_path)
    try:
        await logged(worker, "worker loading its models")
        assert worker.stdin is not None
        if how == "SIGTERM":  # a service manager stopping every process
            worker.send_signal(signal.SIGTERM)
        else:
            worker.stdin.close()
        async with asyncio.timeout(60):
            assert await worker.wait() == 0
        assert not listening(config.socket)
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
