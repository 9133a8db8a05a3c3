"""Acoustic echo cancellation for callers whose own device does none.

A speakerphone, or many SIP desk phones, plays the agent's voice into the
room and its microphone sends it straight back. Without cancellation the
agent hears itself: voice activity detection takes its own words for the
caller speaking, the reply is cut off (a false barge-in) and the echo is
transcribed as a new turn. Browsers cancel echo in ``getUserMedia``; phone
legs often do not, so the service does it here.

The canceller is WebRTC's AEC3 (the audio processing module browsers use),
through the ``livekit`` package's prebuilt binding. AEC3 needs the far end
(what was played) and the near end (what came back) in step, 10 ms at a
time; it estimates the delay between them itself (40-400 ms measured).

Alignment: the outbound track reports each frame as it leaves, with its
stream position, onto a timeline (audio/timeline.py); inbound audio comes
with its own stream position (its RTP timestamps). The first inbound audio
is lined up with what is being sent at that moment, and from then on the
two streams stay lined up by position, so jitter in either direction never
moves the echo relative to its reference (AEC3's linear filter needs that).
The echo always comes back later than its reference, by the network round
trip and both jitter buffers, as AEC3 expects. Silence never sent (DTX)
reads as zeros.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from voice_agent.audio.echo_presence import EchoPresence
from voice_agent.audio.resample import StreamResampler
from voice_agent.audio.residual_echo import ResidualEcho
from voice_agent.audio.timeline import AudioTimeline

log = logging.getLogger(__name__)

RATE = 16_000
CHUNK = RATE // 100  # AEC3 works on 10 ms
# The far-end timeline kept: more than the longest echo delay AEC3 models.
HISTORY_S = 2.0
# Inbound audio whose stream position jumps by more than this (a new
# source, a long loss) is lined up afresh.
RESYNC_S = 1.0
# How much earlier than the first inbound packet a later one may arrive
# (inbound jitter) and still find its far-end reference already written.
# The echo itself must come back later than that, or AEC3 sees it before
# its reference: with packets handled as they arrive, a LAN phone's echo can
# be back in 40 ms, so the margin is one packet; a later packet that gains
# more is caught by the realignment in ``played``. Behind aiortc's playout
# buffer (80 ms more on every echo) the call uses PLAYOUT_JITTER_MARGIN_S.
JITTER_MARGIN_S = 0.02
PLAYOUT_JITTER_MARGIN_S = 0.06
# Far-end 10 ms chunks quieter than this (int16 RMS) count as nothing played.
PLAYING_RMS = 30.0
# Allowed after the echo's delay, in 10 ms chunks, before nothing is left of
# it: 200 ms, for the room's reverberation and for a delay that has grown
# since it was last found (the delay is followed, audio/echo_presence.py,
# but a step is confirmed only after a few hundred ms of speech).
ECHO_TAIL_CHUNKS = 20
# How long after the echo's delay the agent's own echo may still be heard,
# for telling a burst of it from a caller (``echo_may_return``): 100 ms,
# the room's reverberation, a delay step of 40 ms not yet followed, and the
# VAD's last frame. Shorter than the tail above, which only decides whose
# output to use, because a caller's short "no" after the agent falls quiet
# is taken for echo within it.
OWN_ECHO_TAIL_CHUNKS = 10
# Near-end audio this far (dB) above the loudest the echo could be, two 10 ms
# chunks running, is the caller, echo or not (audio/echo_presence.py). On
# recorded speech with a speakerphone's echo, the echo alone came to at
# most 1.7 dB above; a caller's "no" over it 6 dB at the median (over an
# echo 6 dB down) and 0.6 (over one as loud as the agent), 5.4 at p90.
CALLER_OVER_ECHO_DB = 4.0

INSTALL_HINT = "echo cancellation needs the livekit package: pip install 'livekit==1.2.1'"


@dataclass
class EchoStats:
    """What the canceller took out while the agent was speaking."""

    chunks: int = 0
    playing_chunks: int = 0  # 10 ms chunks processed while far-end audio played
    near_energy: float = 0.0  # sums of squares over the playing chunks
    out_energy: float = 0.0
    echo_detected: bool | None = None  # None: not judged yet
    realigned: int = 0  # times the near end had gained on the far end
    bridged_chunks: int = 0  # 10 ms of inbound audio missing, bridged with silence
    delay_changes: int = 0  # the echo's delay found to have moved
    residual_chunks: int = 0  # 10 ms of echo AEC3 let through, attenuated

    @property
    def removed_db(self) -> float | None:
        """Energy removed from the near end while the agent spoke, in dB."""
        if self.playing_chunks == 0 or self.near_energy <= 0.0:
            return None
        return float(10.0 * np.log10(self.near_energy / max(self.out_energy, 1.0)))

    def as_dict(self) -> dict[str, Any]:
        removed = self.removed_db
        return {
            "echo_detected": self.echo_detected,
            "chunks": self.chunks,
            "playing_chunks": self.playing_chunks,
            "realigned": self.realigned,
            "bridged_chunks": self.bridged_chunks,
            "delay_changes": self.delay_changes,
            "residual_chunks": self.residual_chunks,
            "removed_db": None if removed is None else round(removed, 1),
        }


def _audio_processing() -> Any:
    try:
        from livekit import rtc
    except ImportError as exc:  # an install without it: name the fix
        raise RuntimeError(INSTALL_HINT) from exc
    return rtc


class EchoCanceller:
    """One call's echo canceller. ``played`` is fed each outbound frame as
    it leaves (48 kHz int16, with its stream position); ``process`` cleans
    inbound 16 kHz audio given its stream position on the caller's clock,
    and returns as much audio as it was given, echo removed.

    ``far_position`` tells the outbound stream's position now (16 kHz
    samples): the first inbound audio is anchored to it, and from then on
    the two streams stay lined up by position."""

    def __init__(
        self,
        far_position: Callable[[], int],
        jitter_margin_s: float = JITTER_MARGIN_S,
        call_id: str | None = None,
    ) -> None:
        self._call_id = call_id  # for the log
        self._rtc = _audio_processing()
        self._apm = self._rtc.AudioProcessingModule(echo_cancellation=True, high_pass_filter=True)
        self._far_position = far_position
        self._far = AudioTimeline(int(HISTORY_S * RATE))
        self._to_16k = StreamResampler(48_000, RATE, low_latency=True)
        self._margin = int(jitter_margin_s * RATE)
        self._offset: int | None = None  # far-end position minus near-end position
        self._next_near: int | None = None  # where the next inbound audio should start
        self._read_end: int | None = None  # far-end position up to which AEC3 has been fed
        self._pending = np.zeros(0, dtype=np.int16)
        self._quiet_far_chunks = 0  # far-end chunks in a row with nothing played
        self._played = False  # any far-end audio yet
        self._caller_chunks = 0  # near-end chunks in a row louder than any echo
        self.echo_may_return = False  # for the audio last processed: _echo_may_return
        self._residual = ResidualEcho()
        self.presence = EchoPresence()
        self.stats = EchoStats()

    def played(self, samples_48k: np.ndarray, position_48k: int) -> None:
        """One outbound frame, as it leaves."""
        position = position_48k // 3
        if self._read_end is not None and self._offset is not None and position < self._read_end:
            # AEC3 was fed this stretch as silence before it was sent: the
            # near end has gained on the far end (a late first packet, the
            # pacer running late, clock drift). Line them up again so the
            # reference always comes before its echo.
            shift = self._read_end - position + self._margin
            self._offset -= shift
            self._read_end -= shift
            self.stats.realigned += 1
            log.info(
                "echo reference realigned",
                extra={"call_id": self._call_id, "shift_ms": shift * 1000 // RATE},
            )
        self._far.write(position, self._to_16k.process(samples_48k))

    def process(self, near: np.ndarray, position: int) -> np.ndarray:
        """Inbound audio starting at stream ``position`` (16 kHz samples),
        echo removed. Whole 10 ms chunks come out; a remainder waits."""
        expected = self._next_near
        if expected is None or not 0 <= position - expected <= RESYNC_S * RATE:
            # The first audio, or the caller's stream jumped back or far (a
            # new source): line it up with what is being sent now, less a
            # margin for inbound jitter, so the reference comes first.
            self._offset = self._far_position() - position - self._margin
            self._pending = np.zeros(0, dtype=np.int16)
            self._read_end = None
        elif position > expected:
            self._bridge(expected - len(self._pending), position)
        self._next_near = position + len(near)
        start = position - len(self._pending)
        data = np.concatenate((self._pending, near)) if self._pending.size else near
        whole = len(data) - len(data) % CHUNK
        cleaned = [
            self._process_chunk(data[i : i + CHUNK], start + i) for i in range(0, whole, CHUNK)
        ]
        self._pending = data[whole:].copy()
        self.echo_may_return = self._echo_may_return()
        return np.concatenate(cleaned) if cleaned else np.zeros(0, dtype=np.int16)

    def _bridge(self, start: int, end: int) -> None:
        """Inbound audio went missing (loss, a pause in sending): AEC3 still
        gets the far end of the gap, in step, against silence, so its idea
        of the delay holds when the audio resumes."""
        self._pending = np.zeros(0, dtype=np.int16)
        self.stats.bridged_chunks += (end - start) // CHUNK
        silence = np.zeros(CHUNK, dtype=np.int16)
        for at in range(start, end - CHUNK + 1, CHUNK):
            far = self._far_chunk(at)
            self._cancel(far, silence)
            # What played in the gap echoes after it: it counts as played.
            self._note_far(_playing(far))

    def _far_chunk(self, near_position: int) -> np.ndarray:
        assert self._offset is not None
        start = near_position + self._offset
        self._read_end = start + CHUNK
        return self._far.read(start, CHUNK)

    def _cancel(self, far: np.ndarray, near: np.ndarray) -> np.ndarray:
        frame_type = self._rtc.AudioFrame
        self._apm.process_reverse_stream(frame_type(far.tobytes(), RATE, 1, CHUNK))
        frame = frame_type(near.astype(np.int16).tobytes(), RATE, 1, CHUNK)
        self._apm.process_stream(frame)
        return np.frombuffer(frame.data, dtype=np.int16).copy()

    def _process_chunk(self, near: np.ndarray, position: int) -> np.ndarray:
        far = self._far_chunk(position)
        out = self._cancel(far, near)
        # AEC3 runs on every chunk, so it stays adapted, but its output is
        # used only where there may be echo (audio/echo_presence.py), and
        # not once nothing has been played for longer than the echo takes
        # to come back: there is nothing to remove then, and AEC3's
        # suppression, slow to let go after the agent stops, would cost
        # the words of a caller who has just cut the agent off.
        self.presence.push(far, near)
        beyond = self.presence.beyond_echo_db()
        louder = beyond is not None and beyond >= CALLER_OVER_ECHO_DB
        self._caller_chunks = self._caller_chunks + 1 if louder else 0
        if self._caller_chunks == 2 and self._played:
            # Debug: the caller's syllables (on echoing lines in calls, all
            # came while the agent was quiet, none from its echo).
            log.debug(
                "louder than the echo can be: the caller",
                extra={"call_id": self._call_id, "beyond_echo_db": round(beyond or 0.0, 1)},
            )
        # What AEC3 lets through while it re-learns a moved echo path
        # (audio/residual_echo.py).
        out = self._residual.check(far, out, self.presence)
        playing = _playing(far)
        self._count(near, out, playing)
        self._note_far(playing)
        echo_over = self._quiet_far_chunks > self.presence.echo_delay_chunks + ECHO_TAIL_CHUNKS
        # (The raw audio skips AEC3's high-pass filter too: G.711 and Opus
        # carry next to nothing below its 80 Hz.)
        return out if self.presence.cancel and not echo_over else near.astype(np.int16)

    def _note_far(self, playing: bool) -> None:
        self._quiet_far_chunks = 0 if playing else self._quiet_far_chunks + 1
        self._played = self._played or playing

    def _echo_may_return(self) -> bool:
        """Whether the inbound audio just processed may be nothing but the
        agent's own echo (``echo_may_return``, for session/barge_in.py): on
        a line that echoes (or is not judged yet), from the first audio the
        agent played until its echo's delay after it last played, plus
        OWN_ECHO_TAIL_CHUNKS, unless it is louder than the echo can be. Echo
        AEC3 lets through there, and Whisper's words in it, cannot be told
        from the caller otherwise."""
        return (
            self._played
            and self.presence.echo is not False
            and self._quiet_far_chunks <= self.presence.echo_delay_chunks + OWN_ECHO_TAIL_CHUNKS
            and self._caller_chunks < 2
        )

    def _count(self, near: np.ndarray, out: np.ndarray, playing: bool) -> None:
        stats = self.stats
        stats.chunks += 1
        stats.echo_detected = self.presence.echo
        stats.delay_changes = self.presence.delay_changes
        stats.residual_chunks = self._residual.attenuated_chunks
        if not playing:
            return
        stats.playing_chunks += 1
        near_f, out_f = near.astype(np.float64), out.astype(np.float64)
        stats.near_energy += float(np.dot(near_f, near_f))
        stats.out_energy += float(np.dot(out_f, out_f))

    def close(self) -> None:
        """Release AEC3's native state now, not whenever the GC gets to it."""
        self._apm._ffi_handle.dispose()


def _playing(far: np.ndarray) -> bool:
    samples = far.astype(np.float64)
    return float(np.sqrt(np.mean(samples * samples))) >= PLAYING_RMS


def preload() -> None:
    """Load the native library ahead of the first call that needs it (its
    import takes ~0.2 s, which would stall the event loop mid-call)."""
    _audio_processing().AudioProcessingModule(echo_cancellation=True)._ffi_handle.dispose()
