"""Barge-in that a cough or an "mm-hmm" does not set off.

When the caller starts to speak over a reply, the reply is paused at once
(the agent falls quiet within a frame of the onset, as if cut), not
cancelled: after ``onset_frames`` voiced frames (3 by default), before the
turn has started (``speech_start_ms``, 100 ms), so a real interruption is
met 40 ms sooner; a click that stops before the turn starts (two quiet
frames in a row: the detector, which forgives one, cannot start a turn on
it then) resumes it.
It is cancelled when the speech proves to be an interruption:
``min_voiced_ms`` of it, or words that are not a backchannel once the
short turn is transcribed ("stop", "wait"). A burst that ends first with no words
(a cough, a click, a breath) or with only a backchannel ("mm-hmm", "yeah")
is not an interruption: the reply goes on from where it paused, and that
burst is not answered. The burst's first pause is when it is first judged:
its speculative transcript there, if it has no words but a backchannel's,
ends that turn at once so the reply resumes soon; if it has words, the
reply is cancelled and the caller's turn goes on whole.

On a line that echoes, the canceller lets some of the agent's own voice
through while it re-learns a delay that moved (a phone's jitter buffer, a
transfer), and Whisper hears words in it ("Thank you.", "to be called"):
words alone cannot tell that from a caller. Timing and level can. The
reply falls quiet at the onset, so its echo ends one echo delay later,
and the echo is never louder on the line than the agent's level and the
line's echo return allow. The call says, frame by frame, whether a frame
may be nothing but the reply's echo (audio/echo.py); a burst heard only
in such frames is taken for that echo, words or not, and the reply goes
on. A caller's interruption outlasts the echo or is louder than it. The
price, on such lines only: a one-word "no" no louder than the echo that
ends within the echo's delay (plus 100 ms) of the agent falling quiet is
taken for echo too; said again, louder or longer, it interrupts.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from voice_agent.session.reply import AudioOutput, Reply

log = logging.getLogger(__name__)

# Said to show one is listening, not to take the turn (English).
BACKCHANNEL_WORDS = frozenset(
    {"mm", "mmm", "mhm", "mm-hmm", "mmhmm", "hm", "hmm", "uh-huh", "uh", "huh", "um", "yeah",
     "yes", "yep", "yup", "ok", "okay", "right", "sure", "ah", "oh", "aha", "alright", "cool"}
)  # fmt: skip
BACKCHANNEL_PHRASES = ("i see", "got it")


def is_backchannel(text: str) -> bool:
    """Words that only say "go on" (or no words at all)."""
    said = " ".join(re.sub(r"[^a-z' -]", " ", text.lower()).split())
    for phrase in BACKCHANNEL_PHRASES:
        said = re.sub(rf"\b{phrase}\b", " ", said)
    return all(word.strip("-'") in BACKCHANNEL_WORDS for word in said.split())


@dataclass
class _Held:
    response: Reply
    generation: int  # the user turn that paused it
    # The burst began while the reply's echo could come back, and no
    # speech has been heard since at a moment when it could not.
    maybe_echo: bool = False


class BargeIn:
    """One session's paused reply, if any, and the rule that decides it."""

    def __init__(
        self, output: AudioOutput, min_voiced_ms: int, session_id: str, onset_frames: int = 3
    ) -> None:
        self._output = output
        # Voiced 20 ms frames in a row over a reply that pause it, before the
        # turn they may start is certain.
        self.onset_frames = max(1, onset_frames)
        self.min_voiced_ms = min_voiced_ms  # 0: any speech onset cancels at once
        self._session_id = session_id
        self._held: _Held | None = None
        self._onset_frames = 0  # voiced frames in a row over the reply, before a turn
        self._onset_quiet = 0  # then quiet frames in a row
        self._onset_paused = False  # paused by them, no turn started yet
        self._echo_may_return = False  # the latest frame's, as the call said
        self.onsets_lifted = 0  # onset pauses no turn followed (clicks, echo bursts)
        self.resumed = 0  # bursts that were not interruptions
        self.confirmed = 0  # paused replies the caller did interrupt

    def onset_frame(self, voiced: bool) -> None:
        """A frame heard while no turn is under way (``voiced``: speech over
        a reply). ``onset_frames`` in a row pause the reply; two quiet
        frames in a row lift that pause (no turn started: a click, a breath)."""
        if self.min_voiced_ms <= 0 or self._held is not None:
            return
        if voiced:
            self._onset_frames += 1
            self._onset_quiet = 0
            if self._onset_frames >= self.onset_frames and not self._onset_paused:
                self._onset_paused = True
                self._output.pause()
            return
        self._onset_quiet += 1
        if self._onset_quiet >= 2 or not self._onset_paused:
            self._onset_frames = 0
        if self._onset_quiet >= 2 and self._onset_paused:
            self.onsets_lifted += 1
            log.debug("onset pause lifted: no turn", extra={"session": self._session_id})
            self.lift_onset()

    def frame_heard(self, voiced: bool, echo_may_return: bool) -> None:
        """Every frame while turns are detected: ``echo_may_return`` says
        whether the agent's own echo may be in it (a line that echoes, the
        agent playing, or its echo's delay not yet over)."""
        self._echo_may_return = echo_may_return
        held = self._held
        if held is not None and voiced and not echo_may_return:
            held.maybe_echo = False  # speech where no echo could be: the caller's

    def own_echo(self) -> bool:
        """Whether the burst holding the reply was heard only where its own
        echo could be (so it may be nothing but that echo)."""
        return self._held is not None and self._held.maybe_echo

    def lift_onset(self) -> None:
        """The onset's pause is over: no turn came of it (or none will be
        detected: turns are taken by hand now)."""
        self._onset_frames = self._onset_quiet = 0
        if self._onset_paused:
            self._onset_paused = False
            self._output.resume()

    def hold(self, response: Reply, generation: int) -> bool:
        """Speech began over ``response``: pause it (True), or, with no
        minimum, leave the caller to cancel it now (False)."""
        if self.min_voiced_ms <= 0:
            return False
        self._onset_frames = self._onset_quiet = 0  # the turn's hold from here
        self._onset_paused = False
        if self._held is None:
            self._output.pause()
            self._held = _Held(response, generation)
        else:
            self._held.generation = generation  # another burst over the same reply
        self._held.maybe_echo = self._echo_may_return
        return True

    def holding(self, generation: int | None = None) -> bool:
        held = self._held
        return held is not None and (generation is None or held.generation == generation)

    def heard_enough(self, voiced_ms: int) -> bool:
        """Whether this much speech makes an interruption, words or not."""
        return self._held is not None and voiced_ms >= self.min_voiced_ms

    def confirm(self, why: str = "words") -> None:
        """It was an interruption: the reply is cancelled, as if cut at the onset."""
        held, self._held = self._held, None
        if held is None:
            return
        self.confirmed += 1
        log.info(
            "an interruption; the reply is cancelled",
            extra={"session": self._session_id, "why": why, "maybe_echo": held.maybe_echo},
        )
        held.response.cancel("turn_detected")  # flushes what was queued
        self._output.resume()

    def finished(self, response: Reply) -> None:
        """``response`` ended some other way (cancelled by the client, a new
        reply): nothing is held any more, and the output plays again."""
        self.lift_onset()
        if self._held is not None and self._held.response is response:
            self._held = None
            self._output.resume()

    def release(self, why: str) -> None:
        """Not an interruption: the reply goes on from where it paused."""
        self.lift_onset()
        held, self._held = self._held, None
        if held is None:
            return
        self.resumed += 1
        log.info(
            "not an interruption; the reply goes on",
            extra={"session": self._session_id, "why": why},
        )
        self._output.resume()
