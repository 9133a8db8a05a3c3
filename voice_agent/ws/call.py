"""One call over a WebSocket (``GET /v1/realtime``), for servers and phone
gateways that do not want WebRTC.

The same session and protocol as a WebRTC call (``rtc/call.py``): OpenAI
Realtime events as JSON text frames both ways. Audio comes in as
``input_audio_buffer.append`` events (base64 PCM16, 24 kHz mono), which the
protocol feeds to the session as it does for the data channel, and goes out
as ``response.output_audio.delta`` events of the same format.

Outbound audio is paced in real time by the same track a WebRTC call uses
(``rtc/outbound.py``): a delta leaves when its 20 ms would be played. So
``response.done`` still means "played", barge-in still cuts the reply
within one frame, and what the history keeps is what was heard, exactly as
over WebRTC. (OpenAI's WebSocket API sends audio faster than real time and
leaves the cut to ``conversation.item.truncate``; here a client can play the
deltas as they come.)

The session, its output and the call's release are ``rtc/call_core.py``'s,
as for a WebRTC call; what is here is the WebSocket's own: the reader loop
with its idle timeout, the bounded outbox and its writer, and the deltas.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
from collections.abc import Callable
from typing import Any

from aiohttp import WSMsgType, web
from aiortc.mediastreams import MediaStreamError

from voice_agent.audio.echo import EchoCanceller
from voice_agent.audio.resample import StreamResampler
from voice_agent.config import Settings
from voice_agent.realtime.protocol import MAX_UNSENT_EVENT_BYTES
from voice_agent.rtc.call_core import CallCore
from voice_agent.rtc.outbound import SAMPLE_RATE
from voice_agent.session.events import AssistantAudioStarted, ResponseStarted, SessionEvent
from voice_agent.session.session import Models, SessionConfig
from voice_agent.ws.closing import SLOW_CLIENT_CLOSE_CODE, close_client_websocket

log = logging.getLogger(__name__)

WIRE_RATE = 24_000  # OpenAI's audio/pcm
# Events waiting for a slow client; beyond this it is not keeping up with
# its own call (50 audio deltas a second), and the call ends.
MAX_OUTBOX = 1024


class WebSocketCall(CallCore):
    _log = log

    def __init__(
        self,
        call_id: str,
        settings: Settings,
        models: Models,
        session_config: SessionConfig,
        model_name: str,
        voice_name: str,
        ws: web.WebSocketResponse,
        transport: asyncio.Transport | None,
        on_closed: Callable[[WebSocketCall], None],
    ) -> None:
        super().__init__(
            call_id,
            settings,
            models,
            session_config,
            model_name,
            voice_name,
            on_closed,
            # No lead: a WebSocket client plays deltas as they come, holding none back.
            dtx=True,
            lead_frames=0,
        )
        self._max_duration_s = settings.max_call_duration_s
        self._idle_timeout_s = settings.ws_idle_timeout_s
        self._ws = ws
        self._transport = transport
        # A WebSocket client plays and records audio itself: echo is its job.
        self.echo: EchoCanceller | None = None
        self._outbox: asyncio.Queue[str | None] = asyncio.Queue(MAX_OUTBOX)
        self._outbox_bytes = 0  # characters queued, bounded by MAX_UNSENT_EVENT_BYTES
        self._item_of: dict[str, str] = {}  # response id -> its message item
        self._playing: tuple[str, str] | None = None  # (response id, item id)
        self._to_wire = StreamResampler(SAMPLE_RATE, WIRE_RATE)
        self._writer: asyncio.Task[None] | None = None
        self._player: asyncio.Task[None] | None = None

    # -- running ---------------------------------------------------------------
    async def run(self) -> None:
        """Serve the call until the client goes or the call is closed."""
        # Not _spawn()ed: neither ends the call if it fails (the reader says
        # how it ended); the release awaits them with the call's other tasks.
        self._writer = asyncio.create_task(self._write(), name=f"{self.id}-ws-writer")
        self._player = asyncio.create_task(self._send_audio_deltas(), name=f"{self.id}-ws-audio")
        self._tasks.update((self._writer, self._player))
        self.session.prefill_next_turn()
        self.protocol.send_session_created()
        loop = asyncio.get_running_loop()
        longest = loop.call_later(self._max_duration_s, self.close_soon, "max_duration")
        reason = "hangup"
        try:
            while True:
                try:
                    message = await self._ws.receive(timeout=self._idle_timeout_s)
                except TimeoutError:
                    reason = "idle_timeout"
                    break
                if message.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    self.protocol.on_client_message(message.data)
                elif message.type == WSMsgType.CLOSE and message.data == SLOW_CLIENT_CLOSE_CODE:
                    reason = "slow_client"  # the front's word: its client stopped reading
                    break
                elif message.type in (
                    WSMsgType.ERROR,
                    WSMsgType.CLOSE,
                    WSMsgType.CLOSING,
                    WSMsgType.CLOSED,
                ):
                    break
        finally:
            longest.cancel()
            if isinstance(self._ws.exception(), TimeoutError):
                reason = "peer_lost"  # aiohttp's heartbeat: a ping went unanswered
            await self.close(reason)

    async def _write(self) -> None:
        while (text := await self._outbox.get()) is not None:
            self._outbox_bytes -= len(text)
            await self._ws.send_str(text)

    async def _send_audio_deltas(self) -> None:
        """Each 20 ms of reply audio, when it would be heard, as a delta."""
        while True:
            try:
                samples, _ = await self.output.next_frame()
            except MediaStreamError:
                return
            if samples is None or self._playing is None:
                continue  # silence: nothing is sent
            response_id, item_id = self._playing
            pcm = self._to_wire.process(samples)
            self.protocol.send(
                {
                    "type": "response.output_audio.delta",
                    "response_id": response_id,
                    "item_id": item_id,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": base64.b64encode(pcm.astype("<i2").tobytes()).decode("ascii"),
                }
            )

    # -- events ------------------------------------------------------------------
    def _on_session_event(self, event: SessionEvent) -> None:
        if isinstance(event, ResponseStarted):
            self._item_of[event.response_id] = event.item_id
        elif isinstance(event, AssistantAudioStarted):
            # Sent from inside next_frame(), just before that frame's delta.
            self._playing = (event.response_id, self._item_of.get(event.response_id, ""))
        super()._on_session_event(event)

    def _send_event(self, event: dict[str, Any]) -> None:
        if self._teardown is not None:
            return
        text = json.dumps(event, separators=(",", ":"))
        try:
            if self._outbox_bytes + len(text) > MAX_UNSENT_EVENT_BYTES:
                raise asyncio.QueueFull
            self._outbox.put_nowait(text)
            self._outbox_bytes += len(text)
        except asyncio.QueueFull:
            log.warning("client not reading its events; ending the call", extra={"id": self.id})
            self.close_soon("slow_client")

    # -- teardown (the rest is CallCore's) ------------------------------------
    async def _drain(self) -> None:
        """What is queued goes out, for up to a second; the core then cancels
        the writer and the player and awaits them."""
        with contextlib.suppress(asyncio.QueueFull):
            self._outbox.put_nowait(None)  # the writer sends what is queued, then stops
        if self._player is not None:
            self._player.cancel()
        if self._writer is not None:
            with contextlib.suppress(TimeoutError, Exception):
                async with asyncio.timeout(1.0):
                    await asyncio.shield(self._writer)

    async def _close_transport(self) -> None:
        await close_client_websocket(self._ws, self._transport)
