"""What the parts of a voice session share, declared once.

A session is one state machine over the caller's turn. The turn's
generation and item id, the turn detector, the pause's speculation, the
end-of-turn verdict and the reply being given are read and changed by every
step, from a frame's arrival to the reply's end: a speech onset bumps the
generation that a late transcript checks, a turn's end takes the pause's
speculation, a reply's end releases the typed messages held meanwhile.
Collaborators would have to hand that state back and forth and keep their
copies in step; so the steps are mixins of ``VoiceSession``, one module
each, over this one state. ``VoiceSession.__init__`` sets it up; this class
declares it, with the methods one part calls in another, so that each part
type-checks on its own and what crosses between them is listed here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from voice_agent.backends.base import LlmBackend, ToolChoice, ToolSpec
from voice_agent.backends.runtime.durations import Durations
from voice_agent.session.barge_in import BargeIn
from voice_agent.session.conversation import Conversation
from voice_agent.session.endpointing import EndOfTurnJudge
from voice_agent.session.events import SessionError, SessionEvent
from voice_agent.session.hearing import Heard, Hearing
from voice_agent.session.input import ManualTurnBuffer, TurnDetection
from voice_agent.session.metrics import TurnEndCause, TurnMetrics, Verdict
from voice_agent.session.partials import PartialTranscripts
from voice_agent.session.prefill import SessionPrefills
from voice_agent.session.reply import AudioOutput, Reply
from voice_agent.stages.turns import EndCandidate, Paused, TurnDetector, TurnEnded
from voice_agent.stages.vad import SpeechDetector

if TYPE_CHECKING:
    from voice_agent.session.replies import ResponseRequest
    from voice_agent.session.session import Models, SessionConfig
    from voice_agent.session.speculation import Speculation


class SessionState:
    """The session's state (what each attribute holds is told where
    ``VoiceSession.__init__`` sets it up)."""

    id: str
    models: Models
    config: SessionConfig
    output: AudioOutput
    conversation: Conversation
    turn_detection: TurnDetection | None
    audio_output: bool
    voice: str | None
    client_tools: list[ToolSpec]
    tool_choice: ToolChoice
    stt_latency: Durations
    speculations_shed: int
    _emit: Callable[[SessionEvent], None]
    _speech: SpeechDetector
    _detector: TurnDetector
    _hearing: Hearing
    _judge: EndOfTurnJudge | None
    _verdict: Verdict | None
    _barge_in: BargeIn
    _pending: np.ndarray
    _item_id: str | None
    _last_voiced_at: float | None
    _speculation: Speculation | None
    _response: Reply | None
    _turn_tasks: set[asyncio.Task[None]]
    _live_responses: set[Reply]
    _prefills: SessionPrefills
    _reply_llm: LlmBackend
    _deferred_reply: asyncio.Task[None] | None
    _generation: int
    _closed: bool
    _ending: bool
    _manual: ManualTurnBuffer
    _silence_ms: int
    _track_muted: bool
    _held_texts: list[tuple[str, str | None]]
    _partials: PartialTranscripts | None

    if TYPE_CHECKING:
        # Each defined by one part (named), called by others.

        # speculation
        def _start_speculation(self, event: Paused) -> None: ...

        def _drop_speculation(self) -> None: ...

        # end_of_turn
        def _ask_judge(self, event: EndCandidate) -> None: ...

        def _apply_with_words(self, verdict: Verdict, heard: Heard | None) -> None: ...

        # user_turns
        def _on_turn_ended(self, event: TurnEnded, ended_by: TurnEndCause) -> None: ...

        def _start_turn(
            self,
            event: TurnEnded,
            item_id: str,
            spec: Speculation | None,
            metrics: TurnMetrics,
            generation: int,
        ) -> None: ...

        # replies
        def _replying(self) -> bool: ...

        def _interrupts(self) -> bool: ...

        def _answers_turns(self) -> bool: ...

        def _new_response(
            self,
            user_text: str | None,
            metrics: TurnMetrics,
            request: ResponseRequest | None = None,
            failure: SessionError | None = None,
            script: str | None = None,
        ) -> Reply: ...

        def _commit_reply(self, response: Reply) -> None: ...

        # conversation_items
        def add_user_text(self, text: str, item_id: str | None = None) -> None: ...
