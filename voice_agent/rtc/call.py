"""One call: a peer connection, its audio in and out, its data channel, and
the voice session between them.

Every way a call can end (hang-up, a peer that vanishes, one that never
connects, the duration limit, server shutdown) goes through ``close()``,
which releases everything the call holds exactly once. The session, its
output and that release are ``rtc/call_core.py``'s, as for a WebSocket
call; what is here is WebRTC's own: the peer connection and its timers,
the data channel, DTMF and the echo canceller.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import aioice.ice
import numpy as np
from aiortc import (
    MediaStreamTrack,
    RTCConfiguration,
    RTCDataChannel,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpCodecParameters,
    RTCSessionDescription,
)

from voice_agent.audio.echo import JITTER_MARGIN_S, PLAYOUT_JITTER_MARGIN_S, EchoCanceller
from voice_agent.config import Settings
from voice_agent.realtime.protocol import MAX_UNSENT_EVENT_BYTES
from voice_agent.rtc import arrival_order, dtmf, inline_decoding, internals
from voice_agent.rtc.call_core import CallCore
from voice_agent.rtc.datachannel import contain_bad_messages
from voice_agent.rtc.inbound import InboundAudioStopped, pump_inbound_audio
from voice_agent.rtc.outbound import FRAME_MS
from voice_agent.rtc.turn import mint
from voice_agent.session.session import Models, SessionConfig

log = logging.getLogger(__name__)

EVENTS_CHANNEL = "oai-events"
# Events produced before the client's data channel opens wait here (bounded).
MAX_EARLY_EVENTS = 256
# The shortest silence from a connected peer that counts as the peer gone.
MIN_INBOUND_GAP_S = 1.0


def restrict_host_addresses(addresses: list[str]) -> None:
    """Pin ICE host candidates to ``addresses`` (process-wide: aioice gathers
    them in a module-level function). aioice never offers 127.0.0.1 on its
    own, so this is also how two peers on one machine talk over loopback."""
    if not addresses or not internals.patchable("ICE host addresses"):
        return
    pinned = list(addresses)

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in pinned if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses


def server_ice_servers(settings: Settings) -> list[RTCIceServer]:
    """The server's own ICE servers for one new peer connection: the static
    ``--ice-servers`` and, with ``--turn-secret``, the TURN servers with a
    credential minted now (so none is older than the call)."""
    servers = [
        RTCIceServer(urls=url, username=settings.ice_username, credential=settings.ice_credential)
        for url in settings.ice_servers
    ]
    urls = settings.server_turn_urls or settings.turn_urls
    if settings.turn_secret is not None and urls:
        minted = mint(settings.turn_secret, "voice-agent", settings.turn_ttl_s)
        servers += [
            RTCIceServer(urls=url, username=minted.username, credential=minted.credential)
            for url in urls
        ]
    return servers


def ice_configuration(settings: Settings) -> RTCConfiguration:
    # An explicit empty list: aiortc would otherwise fall back to a public STUN server.
    return RTCConfiguration(iceServers=server_ice_servers(settings))


class Call(CallCore):
    _log = log

    def __init__(
        self,
        call_id: str,
        settings: Settings,
        models: Models,
        session_config: SessionConfig,
        model_name: str,
        voice_name: str,
        on_closed: Callable[[Call], None],
    ) -> None:
        contain_bad_messages()
        dtmf.install()
        inline_decoding.ask_for_fec()
        self.pc = RTCPeerConnection(ice_configuration(settings))
        super().__init__(
            call_id,
            settings,
            models,
            session_config,
            model_name,
            voice_name,
            on_closed,
            dtx=settings.output_dtx,
            lead_frames=settings.output_lead_ms // FRAME_MS,
        )
        self._channel: RTCDataChannel | None = None
        self._early_events: deque[str] = deque(maxlen=MAX_EARLY_EVENTS)
        self._listening = False
        self._connect_timer: asyncio.TimerHandle | None = None
        self._lost_timer: asyncio.TimerHandle | None = None
        self.connected = asyncio.Event()
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_connection_state)
        self.codec = "audio/opus"  # until the answer says otherwise
        self.echo: EchoCanceller | None = None
        self._key_presses = dtmf.KeyPresses()
        self.held = False
        self.caller_sends = True  # False: the phone offered recvonly (or inactive)

    # -- negotiation ------------------------------------------------------
    async def answer(self, offer_sdp: str) -> str:
        """Apply the offer and return the answer SDP (ICE candidates included)."""
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=offer_sdp, type="offer"))
        self.pc.addTrack(self.output)
        answer = await self.pc.createAnswer()
        await self.pc.setLocalDescription(answer)
        # aiortc keeps the offer's codec order (RFC 3264): a browser gets
        # Opus, a telephone gateway offering G.711 first gets G.711, and no
        # one transcodes. The outbound track encodes in whichever it is.
        transceiver = next(t for t in self.pc.getTransceivers() if t.kind == "audio")
        if not self.settings.input_playout_buffer:
            arrival_order.use_for(transceiver.receiver)  # before any packet can arrive
        if not self.settings.input_decoder_thread:
            inline_decoding.decode_inline(transceiver.receiver, self.settings.input_opus_16k)
        codecs: list[RTCRtpCodecParameters] = transceiver._codecs
        if not codecs or dtmf.is_telephone_event(codecs[0]):
            raise ValueError("the offer has no audio codec in common (Opus, PCMU or PCMA)")
        self.codec = codecs[0].mimeType
        self.output.use_codec(self.codec)
        if self._cancels_echo():
            self.echo = self._echo_canceller()
        if self.echo is not None:
            self.output.on_samples_sent = self.echo.played
        dtmf.listen(transceiver.receiver, self._on_digit)
        loop = asyncio.get_running_loop()
        self._connect_timer = loop.call_later(
            self.settings.connect_timeout_s, self._timeout, "connect_timeout"
        )
        self._timers.append(self._connect_timer)
        self._timers.append(
            loop.call_later(self.settings.max_call_duration_s, self._timeout, "max_duration")
        )
        return str(self.pc.localDescription.sdp)

    def _cancels_echo(self) -> bool:
        mode = self.settings.echo_cancel
        # A browser cancels echo in getUserMedia; a telephone leg (G.711)
        # is often a speakerphone or desk phone that does not.
        return mode == "on" or (mode == "auto" and not self.codec.lower().endswith("/opus"))

    def _echo_canceller(self) -> EchoCanceller | None:
        try:
            margin = (
                PLAYOUT_JITTER_MARGIN_S if self.settings.input_playout_buffer else JITTER_MARGIN_S
            )
            return EchoCanceller(lambda: self.output.position() // 3, margin, self.id)
        except Exception:
            if self.settings.echo_cancel == "on":
                raise  # asked for explicitly: the call fails, saying why
            # auto: a phone call without echo cancellation beats no call.
            log.exception("echo cancellation unavailable", extra={"call_id": self.id})
            return None

    def _hear(self, samples: np.ndarray, position: int) -> None:
        if self.held:
            return  # music on hold, or whatever the phone sends meanwhile
        echo = self.echo
        echo_may_return = False
        if echo is not None:
            try:
                samples = echo.process(samples, position)
                echo_may_return = echo.echo_may_return
            except Exception:  # a native failure mid-call: hear the caller as is
                log.exception("echo cancellation failed", extra={"call_id": self.id})
                self._stop_echo()
        self.session.push_audio(samples, echo_may_return=echo_may_return)

    def _stop_echo(self) -> None:
        echo, self.echo = self.echo, None
        self.output.on_samples_sent = None
        if echo is not None:
            with contextlib.suppress(Exception):
                echo.close()

    # -- peer connection events -----------------------------------------------
    def _on_track(self, track: MediaStreamTrack) -> None:
        # One voice per session: a second audio track would interleave with
        # the first and garble turn detection and transcription.
        if track.kind != "audio" or self._listening:
            return
        self._listening = True
        self._spawn(self._listen(track), "inbound-audio")

    async def _listen(self, track: MediaStreamTrack) -> None:
        # A gap under a second is jitter or loss; a peer silent for longer
        # than the grace period is gone.
        max_gap_s = max(self.settings.disconnect_grace_s, MIN_INBOUND_GAP_S)
        try:
            await pump_inbound_audio(
                track, self._hear, max_gap_s, lambda: self.held or not self.caller_sends
            )
        except InboundAudioStopped as exc:
            log.warning("peer lost", extra={"call_id": self.id, "error": str(exc)})
            self.close_soon("peer_lost")
            return
        # The track ended without our close: the peer sent an RTCP BYE (a
        # phone gateway's hang-up) or its DTLS went away. aiortc stops the
        # receiver's decoding for good then, so the call could never hear
        # the caller again: end it now rather than leave a deaf call up for
        # as long as the connection lasts (ICE and DTLS may stay up after a
        # BYE: a gateway keeps its side until it is told to hang up).
        if not self.closing:
            log.info("caller's audio ended", extra={"call_id": self.id})
            self.close_soon("peer_bye")

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if channel.label != EVENTS_CHANNEL or self._channel is not None:
            return
        self._channel = channel
        channel.on("message", self.protocol.on_client_message)
        self.protocol.send_session_created()
        while self._early_events:
            self._deliver(channel, self._early_events.popleft(), None)

    def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        log.info("peer connection state", extra={"call_id": self.id, "state": state})
        if state == "connected":
            if not self.connected.is_set():
                # LLM work only for a caller who is there: an offer that
                # never connects (or is hung up at once) costs the model nothing.
                self.session.prefill_next_turn()
            self.connected.set()
            for timer in (self._connect_timer, self._lost_timer):
                if timer is not None:
                    timer.cancel()
        elif state == "disconnected":
            if self._lost_timer is not None:
                self._lost_timer.cancel()  # a connection that flaps keeps one timer
                with contextlib.suppress(ValueError):
                    self._timers.remove(self._lost_timer)
            loop = asyncio.get_running_loop()
            self._lost_timer = loop.call_later(
                self.settings.disconnect_grace_s, self._timeout, "peer_lost"
            )
            self._timers.append(self._lost_timer)
        elif state in ("failed", "closed"):
            self.close_soon(f"peer_{state}")

    def _timeout(self, reason: str) -> None:
        if reason == "peer_lost" and self.pc.connectionState == "connected":
            return  # the connection recovered within the grace period
        self.close_soon(reason)

    def hold(self, held: bool, sending: bool = True) -> bool:
        """The caller put the agent on hold (a SIP re-INVITE with
        ``a=sendonly`` or ``a=inactive``), or took it off; False when it
        already was so. On hold the agent stops speaking (the reply is
        cancelled as an interruption is: the history keeps what was heard),
        hears nothing (music on hold is no turn), and a phone that sends no
        audio at all is not taken for a lost peer. Off hold it listens again,
        the conversation as it was. ``sending`` False (``a=recvonly``: the
        phone listens and sends nothing): its silence is no lost peer either,
        and the agent goes on speaking."""
        if sending != self.caller_sends:
            self.caller_sends = sending
            log.info(
                "caller sends audio" if sending else "caller sends no audio",
                extra={"call_id": self.id},
            )
        if held == self.held:
            return False
        self.held = held
        if held:
            self.session.cancel_response("on_hold")
            self.session.clear_input()  # a turn cut by the hold is no turn
        log.info("call held" if held else "call resumed", extra={"call_id": self.id})
        return True

    def _on_digit(self, digit: str) -> None:
        self.press_key(digit, "rtp")

    def press_key(self, digit: str, way: str) -> bool:
        """A key the caller pressed, from the audio (``rtp``) or reported by
        a SIP gateway (``sip-info``); False when it was the other way's
        report of a press already heard."""
        if not self._key_presses.accept(digit, way):
            log.info("dtmf digit heard both ways", extra={"call_id": self.id, "digit": digit})
            return False
        log.info("dtmf digit", extra={"call_id": self.id, "digit": digit, "way": way})
        # Named as the Realtime API's SIP calls name it.
        self.protocol.send(
            {
                "type": "input_audio_buffer.dtmf_event_received",
                "event": digit,
                "received_at": int(time.time()),
            }
        )
        if digit in self.settings.dtmf_hangup_digits:
            # The server-side hook ("press 0 for a human"): the call ends
            # here, and a SIP gateway turns the end into a BYE (or a transfer).
            self.close_soon("dtmf_hangup")
        return True

    # -- events to the client -------------------------------------------------
    def _send_event(self, event: dict[str, Any]) -> None:
        text = json.dumps(event, separators=(",", ":"))
        channel = self._channel
        if channel is None:
            self._early_events.append(text)
        elif channel.readyState == "open":
            self._deliver(channel, text, event.get("type"))

    def _deliver(self, channel: RTCDataChannel, text: str, kind: str | None) -> None:
        if channel.bufferedAmount + len(text) > MAX_UNSENT_EVENT_BYTES:
            # aiortc queues without bound while the peer does not acknowledge.
            log.warning(
                "client not reading its events; ending the call",
                extra={"call_id": self.id, "buffered": channel.bufferedAmount},
            )
            self.close_soon("slow_client")
            return
        try:
            channel.send(text)
        except ValueError:
            # Larger than the peer accepts (its max-message-size), e.g. the
            # session echoed with huge instructions: say so instead of
            # leaving the client waiting for it.
            log.warning(
                "event too large to send",
                extra={"call_id": self.id, "type": kind, "chars": len(text)},
            )
            with contextlib.suppress(Exception):
                channel.send(json.dumps(self.protocol.undeliverable(kind, len(text))))
        except Exception:  # drop it, keep the call
            log.warning("event not sent", exc_info=True, extra={"call_id": self.id, "type": kind})

    # -- teardown (the rest is CallCore's) ----------------------------------
    async def _close_transport(self) -> None:
        """The echo canceller, then the peer connection."""
        self._stop_echo()
        try:
            await self.pc.close()
        except Exception:
            # aiortc can fail half-way through closing a connection whose
            # negotiation broke; the call is released all the same.
            log.exception("closing the peer connection failed", extra={"call_id": self.id})
