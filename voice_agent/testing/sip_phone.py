"""A SIP phone for the SIP lab (``sip_lab.py``): baresip in the lab's
namespace, saying a recording into the call and recording what it hears."""

from __future__ import annotations

import asyncio
import contextlib
import json
import wave
from pathlib import Path
from typing import Any

import numpy as np

from voice_agent.testing.sip_lab import (
    GATEWAY,
    NUMBER,
    PHONE,
    PHONE_RATE,
    SIP_PORT,
    Process,
    SipLab,
    start,
)


def write_wav(path: Path, samples: np.ndarray, rate: int = PHONE_RATE) -> None:
    """Mono 16-bit WAV, as baresip's aufile plays it."""
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(samples.astype(np.int16).tobytes())


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    """A mono 16-bit WAV's samples and rate."""
    with wave.open(str(path)) as handle:
        samples = np.frombuffer(handle.readframes(handle.getnframes()), dtype=np.int16)
        return samples.copy(), handle.getframerate()


class Phone:
    """baresip, driven over its ctrl_tcp socket (JSON netstrings)."""

    def __init__(
        self,
        lab: SipLab,
        name: str,
        microphone: np.ndarray,
        sip_port: int = 5070,
        control_port: int = 4444,
    ) -> None:
        self.lab = lab
        self.control_port = control_port
        self.dir = lab.workdir / name
        self.recordings = self.dir / "recordings"
        self.recordings.mkdir(parents=True)
        write_wav(self.dir / "mic.wav", microphone)
        (self.dir / "accounts").write_text(f"<sip:caller@{PHONE}:{sip_port}>;regint=0\n")
        (self.dir / "config").write_text(
            "\n".join(
                [
                    "poll_method epoll",
                    f"sip_listen {PHONE}:{sip_port}",
                    "audio_player aubridge,nil",
                    f"audio_source aufile,{self.dir / 'mic.wav'}",
                    "audio_alert aubridge,nil",
                    "module_path /usr/lib/baresip/modules",
                    "module g711.so",
                    "module aufile.so",
                    "module aubridge.so",
                    # Records what it hears (and says) as WAV files.
                    "module sndfile.so",
                    f"snd_path {self.recordings}",
                    "module_app account.so",
                    "module_app menu.so",
                    "module_app ctrl_tcp.so",
                    f"ctrl_tcp_listen {PHONE}:{control_port}",
                    "",
                ]
            )
        )
        self.process: Process | None = None
        self.events: list[dict[str, Any]] = []
        self._changed = asyncio.Event()
        self._writer: asyncio.StreamWriter | None = None
        self._reader_task: asyncio.Task[None] | None = None
        self._token = 0

    async def start(self) -> None:
        self.process = await start(self.lab.namespace, "baresip", "baresip", "-f", str(self.dir))
        await self.process.log.wait_for("baresip is ready", 10)
        reader, self._writer = await self.lab.namespace.open_connection(PHONE, self.control_port)
        self._reader_task = asyncio.create_task(self._read(reader), name="baresip-control")

    async def _read(self, reader: asyncio.StreamReader) -> None:
        while True:
            try:
                length = int((await reader.readuntil(b":"))[:-1])
                message = json.loads((await reader.readexactly(length + 1))[:-1])  # then ","
            except (asyncio.IncompleteReadError, ValueError):
                return
            self.events.append(message)
            self._changed.set()
            self._changed = asyncio.Event()

    async def command(self, name: str, params: str = "") -> None:
        assert self._writer is not None
        self._token += 1
        body = json.dumps({"command": name, "params": params, "token": str(self._token)}).encode()
        self._writer.write(b"%d:%s," % (len(body), body))
        await self._writer.drain()

    async def event(self, kind: str, within_s: float) -> dict[str, Any]:
        try:
            async with asyncio.timeout(within_s):
                while True:
                    for event in self.events:
                        if event.get("event") and event.get("type") == kind:
                            return event
                    await self._changed.wait()
        except TimeoutError:
            assert self.process is not None
            gateway = self.lab.gateway.process.log.tail(20)
            service = self.lab.service.log.tail(20)
            raise AssertionError(
                f"baresip: no {kind} within {within_s:g} s; its messages: {self.events}\n"
                f"its log:\n{self.process.log.tail(20)}\ngateway log:\n{gateway}\n"
                f"service log:\n{service}"
            ) from None

    async def dial(self, number: str = NUMBER, port: int = SIP_PORT) -> None:
        await self.command("dial", f"sip:{number}@{GATEWAY}:{port}")

    async def press(self, digits: str) -> None:
        """Key presses, sent as RFC 4733 telephone-events."""
        for digit in digits:
            await self.command("sndcode", digit)  # pressed and released
            await asyncio.sleep(0.3)  # one key at a time, as fingers do

    def heard(self) -> tuple[np.ndarray, int]:
        """What the phone received and played, as recorded."""
        (path,) = self.recordings.glob("*-dec.wav")
        return read_wav(path)

    async def stop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reader_task is not None:
            self._reader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader_task
        if self.process is not None:
            await self.process.stop()
