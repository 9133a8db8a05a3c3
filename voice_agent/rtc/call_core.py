"""What every call is, whichever transport carries it: the paced output
track, the voice session and the Realtime protocol wired together, and the
one way a call ends.

A WebRTC call (``rtc/call.py``) and a WebSocket call (``ws/call.py``) differ
only in how events and audio reach the client; this is everything else.
The session's events are observed (``observability``) and handed to the
protocol, and the protocol's events go to the transport's ``_send_event``.
Every way a call ends goes through ``close_soon()``: the release runs once,
to the end even if whoever awaits it is cancelled, and in one order: the
session is closed, the output stopped, the transport drains what it owes
the client (``_drain``), the call's tasks are cancelled and awaited, the
transport lets go of its link (``_close_transport``), and then ``closed``
is set, ``on_closed`` told, and the heap trimmed if configured.

A base class rather than an object each transport holds: what is shared is
exactly the face the server sees (``id``, ``session``, ``output``,
``protocol``, ``closed``, ``close_reason``, ``close()``), so inheriting it
states that face once, with no forwarding methods or properties, and the
transports differ only at the two fixed points in the teardown above,
which are methods they override. Its log lines go out under the
transport's logger (``_log``), as the transport's own lines do.

It lives in ``rtc/`` beside the paced track it builds, which the WebSocket
call already takes from here; nothing in it is WebRTC.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any, ClassVar, Self

from voice_agent import observability
from voice_agent.config import Settings
from voice_agent.memory import TRIMMER
from voice_agent.realtime.protocol import RealtimeProtocol
from voice_agent.rtc.outbound import PacedAudioTrack
from voice_agent.session.events import SessionEvent
from voice_agent.session.session import Models, SessionConfig, VoiceSession


class CallCore:
    """A session, its output and its protocol, and their release (once).

    A transport implements ``_send_event`` and ``_close_transport``, and
    may override ``_drain`` and ``_on_session_event`` (calling this one)."""

    # The transport's module logger: the lines logged here name it.
    _log: ClassVar[logging.Logger] = logging.getLogger(__name__)

    def __init__(
        self,
        call_id: str,
        settings: Settings,
        models: Models,
        session_config: SessionConfig,
        model_name: str,
        voice_name: str,
        on_closed: Callable[[Self], None],
        *,
        dtx: bool,
        lead_frames: int,
    ) -> None:
        self.id = call_id
        self.settings = settings
        self._on_closed: Callable[[Self], None] = on_closed
        self.output = PacedAudioTrack(
            buffer_ms=settings.output_buffer_ms, dtx=dtx, lead_frames=lead_frames
        )
        self.session = VoiceSession(models, session_config, self.output, self._on_session_event)
        self.output.on_audio_frame = self.session.frame_sent
        self.protocol = RealtimeProtocol(
            self.session, self._send_event, model_name, voice_name, settings.llm_max_tokens
        )
        self._tasks: set[asyncio.Task[None]] = set()
        # Timers the transport sets; the release cancels them first thing.
        self._timers: list[asyncio.TimerHandle] = []
        self._teardown: asyncio.Future[None] | None = None
        self.closed = asyncio.Event()
        self.close_reason: str | None = None

    # -- what the transport provides -------------------------------------------
    def _send_event(self, event: dict[str, Any]) -> None:
        """Deliver one server event to the client."""
        raise NotImplementedError

    async def _drain(self) -> None:
        """After the output stops and before the tasks are cancelled: what
        the transport still owes the client goes out. Nothing by default."""

    async def _close_transport(self) -> None:
        """Let go of the connection to the client (also when the steps
        before it failed)."""
        raise NotImplementedError

    # -- events to the client ----------------------------------------------------
    def _on_session_event(self, event: SessionEvent) -> None:
        observability.observe(event)
        self.protocol.on_session_event(event)

    # -- tasks -------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        """Run ``coro`` for the life of the call; if it fails, the call ends."""
        task = asyncio.create_task(coro, name=f"{self.id}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # A call that can no longer hear is over; say so and release it.
            self._log.error(
                "call task failed",
                exc_info=task.exception(),
                extra={"call_id": self.id, "task": task.get_name()},
            )
            self.close_soon("internal_error")

    # -- teardown ----------------------------------------------------------------
    @property
    def closing(self) -> bool:
        """Its release has begun (``closed`` is set once it has ended)."""
        return self._teardown is not None

    def close_soon(self, reason: str) -> asyncio.Future[None]:
        """Start releasing the call (once); the teardown runs to the end even
        if whoever awaits it is cancelled (a hang-up cut short, shutdown)."""
        if self._teardown is None:
            self.close_reason = reason
            self._teardown = asyncio.ensure_future(self._release(reason))
        return self._teardown

    async def close(self, reason: str = "hangup") -> None:
        """Release everything and wait until it is done."""
        await asyncio.shield(self.close_soon(reason))

    async def _release(self: Self, reason: str) -> None:
        self._log.info("call closing", extra={"call_id": self.id, "reason": reason})
        for timer in self._timers:
            timer.cancel()
        try:
            try:
                await self.session.close()
            except Exception:
                self._log.exception("closing the session failed", extra={"call_id": self.id})
            self.output.stop()
            await self._drain()
            for task in list(self._tasks):
                task.cancel()
            for task in list(self._tasks):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        finally:
            try:
                await self._close_transport()
            finally:
                self.closed.set()
                self._on_closed(self)
                if self.settings.malloc_trim:
                    # What the call freed goes back to the kernel, not into
                    # glibc's arenas (where it stays resident).
                    TRIMMER.request()
