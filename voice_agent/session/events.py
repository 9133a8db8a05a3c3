"""What a session reports, in its own terms; the protocol layer maps these
onto the wire format. Nothing here knows about JSON or data channels."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from voice_agent.session.metrics import TurnMetrics


@dataclass(frozen=True)
class UserSpeechStarted:
    item_id: str
    audio_start_ms: int


@dataclass(frozen=True)
class UserSpeechStopped:
    item_id: str
    audio_end_ms: int


@dataclass(frozen=True)
class UserTurnCommitted:
    item_id: str


@dataclass(frozen=True)
class UserTranscript:
    item_id: str
    transcript: str


@dataclass(frozen=True)
class UserTranscriptFailed:
    """The user's turn could not be transcribed (the STT raised or hung)."""

    item_id: str
    code: str
    message: str


@dataclass(frozen=True)
class UserTranscriptDelta:
    """More words of the user's turn in progress (append-only)."""

    item_id: str
    delta: str


@dataclass(frozen=True)
class ResponseStarted:
    response_id: str
    item_id: str
    audio: bool = True  # False: a text-only reply (no speech is synthesised)
    in_conversation: bool = True  # False: out of band, the history never sees it
    metadata: Mapping[str, str] | None = None  # the client's labels for it
    voice: str | None = None  # the voice it speaks with; None: the TTS's default


@dataclass(frozen=True)
class AssistantTextDelta:
    response_id: str
    item_id: str
    delta: str


@dataclass(frozen=True)
class AssistantAudioStarted:
    response_id: str


@dataclass(frozen=True)
class AssistantAudioStopped:
    response_id: str


@dataclass(frozen=True)
class AssistantAudioCleared:
    response_id: str


@dataclass(frozen=True)
class ResponseFinished:
    response_id: str
    item_id: str
    status: Literal["completed", "cancelled", "failed"]
    reason: str | None
    transcript: str  # for a cancelled reply: only what was heard
    metrics: TurnMetrics | None = field(default=None)


@dataclass(frozen=True)
class FunctionCallRequested:
    """The model called a function the client declared; the client runs it
    and sends the result back."""

    response_id: str
    item_id: str
    call_id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class SessionError:
    code: str
    message: str
    # What a reply that fails with this error says (None: the apology).
    spoken: str | None = None


SessionEvent = (
    UserSpeechStarted
    | UserSpeechStopped
    | UserTurnCommitted
    | UserTranscript
    | UserTranscriptFailed
    | UserTranscriptDelta
    | ResponseStarted
    | AssistantTextDelta
    | AssistantAudioStarted
    | AssistantAudioStopped
    | AssistantAudioCleared
    | ResponseFinished
    | FunctionCallRequested
    | SessionError
)
