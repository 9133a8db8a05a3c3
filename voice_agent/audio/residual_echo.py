"""Echo that AEC3 lets through while it re-learns a changed echo path.

AEC3 finds the echo's delay itself and models the path after it. When the
delay changes mid-call (a phone's jitter buffer shrinking or growing, a
call transferred to another phone), it takes 1-3 s of the agent's speech
to find it again (measured offline: 2-10 dB removed for 2-3 s after a
40 ms step, 30 dB before and after), and meanwhile the echo passes almost
whole: the agent hears its own words, takes them for the caller and stops
(a false barge-in), or transcribes them.

So, on a line known to echo, AEC3's output is watched for the agent's
syllables: the output's 10 ms energy envelope over the last 400 ms,
correlated with the far end's at every delay within 120 ms of the one
found (a step either way). Output that follows the far end that closely
is echo AEC3 let through, and is attenuated. A caller talking over the
agent follows their own syllables, not the agent's, and passes; so does
AEC3's output while it cancels (there is nothing left to follow).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from voice_agent.audio.echo_presence import FAR_ACTIVE_DB, EchoPresence, energy_db

# Delays around the one found that the echo may have moved to: 120 ms either way.
SPREAD = 12
LAG_STEP = 2
# The output's envelope judged over the last 400 ms (500 let more echo
# through before it was found; 300 attenuated a caller talking over the
# agent, in the offline tests).
WINDOW = 40
HISTORY = WINDOW + 64 + SPREAD
# Output following the far end this closely is echo (the presence test's
# threshold for echo, on a shorter window).
FOLLOWS = 0.7
# Output this far above the line's noise floor (dB) could be heard as speech.
AUDIBLE_DB = 40.0
ATTENUATION = 0.03  # -30 dB


class ResidualEcho:
    def __init__(self) -> None:
        self._far_db: deque[float] = deque(maxlen=HISTORY)
        self._out_db: deque[float] = deque(maxlen=WINDOW)
        self.attenuated_chunks = 0

    def check(self, far: np.ndarray, out: np.ndarray, presence: EchoPresence) -> np.ndarray:
        self._far_db.append(energy_db(far))
        out_db = energy_db(out)
        self._out_db.append(out_db)
        if presence.echo is not True or out_db < AUDIBLE_DB or len(self._out_db) < WINDOW:
            return out
        if self._follows_far(presence.echo_delay_chunks):
            self.attenuated_chunks += 1
            return (out.astype(np.float64) * ATTENUATION).astype(np.int16)
        return out

    def _follows_far(self, lag: int) -> bool:
        far = np.array(self._far_db)
        heard = np.array(self._out_db)
        heard = heard - heard.mean()
        spread_heard = float(np.sqrt((heard * heard).mean()))
        if spread_heard < 1e-6:
            return False
        for k in range(max(0, lag - SPREAD), lag + SPREAD + 1, LAG_STEP):
            end = len(far) - k
            if end - WINDOW < 0:
                break
            sent = far[end - WINDOW : end]
            if int((sent >= FAR_ACTIVE_DB).sum()) < WINDOW // 2:
                continue
            sent = sent - sent.mean()
            spread = float(np.sqrt((sent * sent).mean())) * spread_heard
            if spread > 1e-6 and float((sent * heard).mean()) / spread >= FOLLOWS:
                return True
        return False
