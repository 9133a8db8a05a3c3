"""A Python Realtime WebRTC client: for tests, benchmarks and gateways.

It speaks exactly what a browser speaks: an SDP offer POSTed to
``/v1/realtime/calls``, microphone audio on an Opus track, events on the
``oai-events`` data channel. Audio to send is queued as 16-bit PCM and paced
in real time (silence when the queue is empty); received audio is kept with
its arrival times so latency can be measured from the client's side.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import av
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCIceServer,
    RTCIceTransportPolicy,
    RTCPeerConnection,
    RTCRtpSender,
    RTCSessionDescription,
)
from aiortc.mediastreams import MediaStreamError
from aiortc.rtp import RtpPacket

from voice_agent.audio.resample import StreamResampler
from voice_agent.audio.timeline import AudioTimeline
from voice_agent.rtc import dtmf
from voice_agent.rtc.dtmf_events import EVENTS as KEYS
from voice_agent.rtc.g711 import FrameEncoder, encoder_for
from voice_agent.rtc.inbound import frame_to_mono_int16
from voice_agent.rtc.opus import make_packet, opus_fec_asked

RATE = 48_000
FRAME = 960


class SimulatedEcho:
    """A speakerphone without echo cancellation: what the client receives
    comes back into its microphone ``delay_ms`` later, through a small room
    (a direct path and three decaying reflections), ``gain_db`` louder or
    quieter. Loudspeaker and microphone share one clock, as on a device:
    received audio is placed by its stream position, so network jitter never
    moves the echo. For tests and benchmarks of the server's echo handling."""

    def __init__(self, delay_ms: float = 150.0, gain_db: float = -6.0) -> None:
        self.delay = int(delay_ms * RATE / 1000)
        room = np.zeros(RATE * 40 // 1000)
        for at_ms, level in ((0, 1.0), (7, 0.45), (19, -0.25), (33, 0.12)):
            room[RATE * at_ms // 1000] = level
        self._room = room * 10 ** (gain_db / 20)
        self._tail = np.zeros(len(room) - 1)
        self._line = AudioTimeline(2 * RATE)
        self._resampler: StreamResampler | None = None
        self._offset: int | None = None  # microphone position minus received position
        self.mic_position: Callable[[], int] = lambda: 0

    def heard(self, samples: np.ndarray, rate: int, pts: int | None) -> None:
        """Audio the client received (and its loudspeaker played), with its timestamp."""
        position = (pts or 0) * RATE // rate
        if rate != RATE:
            if self._resampler is None or self._resampler.in_rate != rate:
                self._resampler = StreamResampler(rate, RATE, low_latency=True)
            samples = self._resampler.process(samples)
        if self._offset is None:
            self._offset = self.mic_position() - position + self.delay
        signal = np.concatenate((self._tail, samples.astype(np.float64)))
        echo = np.convolve(signal, self._room, mode="valid")
        self._tail = signal[len(signal) - len(self._tail) :]
        self._line.write(position + self._offset, np.clip(echo, -32768, 32767).astype(np.int16))

    def picked_up(self, position: int, count: int) -> np.ndarray:
        """What the microphone picks up of it at its stream ``position``."""
        return self._line.read(position, count)

    def step(self, delta_ms: float) -> None:
        """The echo's delay changes by ``delta_ms`` from the audio received
        next on (a phone's jitter buffer growing or shrinking, a transfer):
        a step up leaves a gap in the echo, a step down overlaps it."""
        delta = int(delta_ms * RATE / 1000)
        self.delay += delta
        if self._offset is not None:
            self._offset += delta


class PcmSource(MediaStreamTrack):
    """An outgoing audio track playing queued PCM on a real-time clock
    (plus, with ``echo``, the echo of what the client plays)."""

    kind = "audio"

    def __init__(self, codec: str = "audio/opus", echo: SimulatedEcho | None = None) -> None:
        super().__init__()
        self.echo = echo
        if echo is not None:
            echo.mic_position = self.position
        self._queue: deque[np.ndarray] = deque()
        self._pending = np.zeros(0, dtype=np.int16)
        self._start: float | None = None
        self._index = 0
        self.sent_audio_frames = 0
        self._done_waiters: list[tuple[int, asyncio.Future[float]]] = []
        self._queued_frames = 0
        self.encoder: FrameEncoder = encoder_for(codec)
        self._sending = asyncio.Event()
        self._sending.set()
        self._stopped_at: float | None = None

    def stop_sending(self) -> None:
        """Send no packets at all until ``resume_sending`` (a phone that puts
        the call on hold with ``a=inactive``); queued audio waits."""
        if self._sending.is_set():
            self._sending.clear()
            self._stopped_at = time.monotonic()

    def resume_sending(self) -> None:
        if self._stopped_at is not None and self._start is not None:
            # The pacing clock skips the pause: no burst of overdue frames.
            self._start += time.monotonic() - self._stopped_at
        self._stopped_at = None
        self._sending.set()

    def play(self, samples: np.ndarray, rate: int) -> asyncio.Future[float]:
        """Queue mono int16 audio; the future resolves with the monotonic time
        at which its last frame was sent."""
        audio = StreamResampler(rate, RATE).process(samples, last=True) if rate != RATE else samples
        data = np.concatenate((self._pending, audio))
        whole = len(data) - len(data) % FRAME
        for start in range(0, whole, FRAME):
            self._queue.append(data[start : start + FRAME])
        tail = data[whole:]
        if tail.size:
            self._queue.append(np.concatenate((tail, np.zeros(FRAME - tail.size, np.int16))))
        self._pending = np.zeros(0, dtype=np.int16)
        self._queued_frames += -(-len(data) // FRAME)
        done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._done_waiters.append((self._queued_frames, done))
        return done

    def position(self) -> int:
        """This track's timestamp now, in samples."""
        if self._start is None:
            return 0
        return int((time.monotonic() - self._start) * RATE)

    async def recv(self) -> av.Packet[Any]:
        if self.readyState != "live":
            raise MediaStreamError
        await self._sending.wait()
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self._index * 0.02
        if due > now:
            await asyncio.sleep(due - now)
        # Pre-encoded like the server's track, so a load test spends its CPU
        # on the server rather than on encoding silence in the client.
        payload = self.encoder.silence()
        echo = None if self.echo is None else self.echo.picked_up(self._index * FRAME, FRAME)
        if self._queue:
            frame = self._queue.popleft()
            if echo is not None:
                frame = np.clip(frame.astype(np.int32) + echo, -32768, 32767).astype(np.int16)
            payload = self.encoder.encode(frame)
            self.sent_audio_frames += 1
            sent_at = time.monotonic()
            while self._done_waiters and self._done_waiters[0][0] <= self.sent_audio_frames:
                _, waiter = self._done_waiters.pop(0)
                if not waiter.done():
                    waiter.set_result(sent_at)
        elif echo is not None and echo.any():
            payload = self.encoder.encode(echo)
        packet = make_packet(payload, self._index * FRAME)
        self._index += 1
        return packet


@dataclass
class ReceivedAudio:
    """Everything received on the remote track, with arrival times."""

    chunks: list[np.ndarray] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)

    def add(self, samples: np.ndarray) -> None:
        self.chunks.append(samples)
        self.arrivals.append(time.monotonic())

    def first_sound_after(self, t: float, threshold: int = 500) -> float | None:
        """Arrival time of the first received frame after ``t`` whose peak
        exceeds ``threshold`` (int16)."""
        for samples, arrived in zip(self.chunks, self.arrivals, strict=True):
            if arrived >= t and samples.size and int(np.abs(samples).max()) > threshold:
                return arrived
        return None

    def peak_between(self, start: float, end: float) -> int:
        peaks = [
            int(np.abs(s).max())
            for s, a in zip(self.chunks, self.arrivals, strict=True)
            if start <= a < end and s.size
        ]
        return max(peaks, default=0)


def ice_servers_from(answer: dict[str, Any]) -> list[RTCIceServer]:
    """The ``ice_servers`` of a ``GET /v1/ice-servers`` answer, for aiortc."""
    return [
        RTCIceServer(
            urls=server["urls"],
            username=server.get("username"),
            credential=server.get("credential"),
        )
        for server in answer["ice_servers"]
    ]


async def fetch_ice_servers(
    session: aiohttp.ClientSession, base_url: str, token: str | None = None
) -> list[RTCIceServer]:
    """The server's ICE servers for this client, TURN credentials minted for it."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with session.get(f"{base_url.rstrip('/')}/v1/ice-servers", headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"ICE servers refused: {response.status} {await response.text()}")
        return ice_servers_from(await response.json())


class RealtimeClient:
    """``codec``: offer only this codec (e.g. "audio/PCMU", as a telephone
    gateway does); ``ice_lite``: mark the offer ``a=ice-lite``, as gateways
    such as rtpengine can; ``echo``: the client's loudspeaker leaks into its
    microphone, as a speakerphone's does; ``opus_fec_loss``: where the
    answer asks for Opus in-band FEC (``useinbandfec=1``), send it, coded
    for that percentage of packets lost. A browser does so once RTCP tells
    it the link's loss; this client is told the loss instead (0, the
    default: no FEC, as aiortc sends)."""

    def __init__(
        self,
        base_url: str,
        ice_servers: list[Any] | None = None,
        token: str | None = None,
        relay_only: bool = False,
        codec: str | None = None,
        ice_lite: bool = False,
        echo: SimulatedEcho | None = None,
        opus_fec_loss: int = 0,
    ) -> None:
        dtmf.install()  # offers carry telephone-event, as a phone's do
        self.base_url = base_url.rstrip("/")
        self.codec = codec
        self.ice_lite = ice_lite
        self.opus_fec_loss = opus_fec_loss
        # An API key or a client secret, sent as Authorization: Bearer.
        self.token = token
        # relay_only: offer only TURN relay candidates (as a browser's
        # iceTransportPolicy "relay"), e.g. to prove a TURN path works.
        policy = RTCIceTransportPolicy.RELAY if relay_only else RTCIceTransportPolicy.ALL
        self.pc = RTCPeerConnection(
            RTCConfiguration(iceServers=ice_servers or [], iceTransportPolicy=policy)
        )
        self.mic = PcmSource(codec or "audio/opus", echo)
        self.received = ReceivedAudio()
        self.events: list[dict[str, Any]] = []
        self.event_times: list[float] = []
        self._waiters: list[
            tuple[Callable[[dict[str, Any]], bool], asyncio.Future[dict[str, Any]]]
        ] = []
        self.channel = self.pc.createDataChannel("oai-events")
        self.channel.on("message", self._on_message)
        self.location: str | None = None
        self._dtmf_sequence = 0
        self._reader: asyncio.Task[None] | None = None
        self.pc.on("track", self._on_track)
        self.channel_open = asyncio.Event()
        self.channel.on("open", self.channel_open.set)

    def _on_message(self, message: str | bytes) -> None:
        event = json.loads(message)
        self.events.append(event)
        self.event_times.append(time.monotonic())
        for predicate, future in list(self._waiters):
            if not future.done() and predicate(event):
                future.set_result(event)
                self._waiters.remove((predicate, future))

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio":
            self._reader = asyncio.create_task(self._read(track))

    async def _read(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                return
            assert isinstance(frame, av.AudioFrame)
            samples = frame_to_mono_int16(frame)
            self.received.add(samples)
            if self.mic.echo is not None:
                self.mic.echo.heard(samples, frame.sample_rate, frame.pts)

    async def connect(self, session: aiohttp.ClientSession, open_timeout: float = 20.0) -> None:
        self.pc.addTrack(self.mic)
        if self.codec is not None:
            wanted = self.codec.lower()
            capabilities = RTCRtpSender.getCapabilities("audio").codecs
            # As a phone: the one audio codec, then telephone-event for key presses.
            chosen = [c for c in capabilities if c.mimeType.lower() == wanted]
            chosen += [c for c in capabilities if c.mimeType.lower() == dtmf.MIME_TYPE != wanted]
            self.pc.getTransceivers()[0].setCodecPreferences(chosen)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = self.pc.localDescription.sdp
        if self.ice_lite:
            offer = offer.replace("\r\nt=0 0\r\n", "\r\nt=0 0\r\na=ice-lite\r\n", 1)
        async with session.post(
            f"{self.base_url}/v1/realtime/calls",
            data=offer,
            headers={
                "Content-Type": "application/sdp",
                **({"Authorization": f"Bearer {self.token}"} if self.token else {}),
            },
        ) as response:
            body = await response.text()
            if response.status != 201:
                raise RuntimeError(f"offer refused: {response.status} {body}")
            self.location = response.headers["Location"]
        if self.opus_fec_loss > 0 and opus_fec_asked(body):
            self.mic.encoder = encoder_for("audio/opus", self.opus_fec_loss)
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body, type="answer"))
        async with asyncio.timeout(open_timeout):
            await self.channel_open.wait()

    async def send_dtmf(self, digit: str, duration_ms: int = 100) -> None:
        """Press a key: RFC 4733 telephone-event packets, every 20 ms while
        held, the end three times. They go on their own SSRC, so the audio
        stream's SRTP sequence numbers stay untouched."""
        transceiver = self.pc.getTransceivers()[0]
        event = next(c for c in transceiver._codecs if dtmf.is_telephone_event(c))
        assert event.payloadType is not None  # negotiated
        transport = transceiver.sender.transport
        ssrc, start = random.getrandbits(32), random.getrandbits(32)
        steps = max(1, duration_ms // 20)
        for step in range(steps + 3):
            end = step >= steps
            duration = min(step + 1, steps) * 160
            payload = bytes([KEYS.index(digit), 0x80 if end else 0]) + duration.to_bytes(2, "big")
            packet = RtpPacket(
                payload_type=event.payloadType,
                marker=int(step == 0),
                sequence_number=(self._dtmf_sequence + step) & 0xFFFF,
                timestamp=start,
                ssrc=ssrc,
                payload=payload,
            )
            try:
                await transport._send_rtp(packet.serialize())
            except ConnectionError:
                return  # hung up mid-press (the key may be one that ends the call)
            await asyncio.sleep(0.02)
        self._dtmf_sequence += steps + 3

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], after: int = 0
    ) -> asyncio.Future[dict[str, Any]]:
        """A future for the first event (from index ``after``) matching ``predicate``."""
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        for event in self.events[after:]:
            if predicate(event):
                future.set_result(event)
                return future
        self._waiters.append((predicate, future))
        return future

    def wait_for_type(self, event_type: str, after: int = 0) -> asyncio.Future[dict[str, Any]]:
        return self.wait_for(lambda e: e.get("type") == event_type, after)

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == event_type]

    def send(self, event: dict[str, Any]) -> None:
        self.channel.send(json.dumps(event))

    @property
    def call_url(self) -> str:
        """The call's URL: its Location, resolved against the base URL when a
        path (an absolute Location names the replica that owns the call)."""
        assert self.location is not None, "not connected"
        if urlsplit(self.location).scheme:
            return self.location
        return f"{self.base_url}{self.location}"

    def selected_candidates(self) -> tuple[str, str] | None:
        """The types (host, srflx, relay) of the local and remote candidate
        ICE selected, None before it has. aiortc has no getStats() pair for
        this, so it is read from its aioice connection."""
        transport = self.pc.sctp.transport.transport if self.pc.sctp is not None else None
        connection = getattr(transport, "_connection", None)
        nominated = getattr(connection, "_nominated", {})
        pair = nominated.get(1)
        if pair is None:
            return None
        return str(pair.local_candidate.type), str(pair.remote_candidate.type)

    async def hangup(self, session: aiohttp.ClientSession | None = None) -> None:
        if session is not None and self.location is not None:
            # The call's maker may end it: the key, or the secret it was made with.
            headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
            async with session.delete(self.call_url, headers=headers):
                pass
        if self._reader is not None:
            self._reader.cancel()
        await self.pc.close()
