"""Whether the caller's microphone hears the agent at all.

WebRTC's AEC3 starts every call unsure of the echo path, and for its first
two or three seconds of far-end audio it suppresses the near end hard
(11-14 dB measured) in case it is echo. On a line with echo that is what
stops the agent from interrupting itself; on a handset or headset, which
returns no echo, it only hides the caller who talks over the agent's first
reply (and measured offline, AEC3 still took 12 dB off such a caller
after 3 s of its speech when they talked over it). So the canceller's
output is used only while there is reason to think there is echo: from the
start (the safe default), and for the rest of the call once echo has been
seen. Once the agent has spoken for a while with the caller's end quiet and
nothing following it back, the caller's audio passes through untouched
(until echo shows up after all).

Echo is recognised by its shape, not its level: the near end's loudness,
frame by frame, follows the far end's a round trip later. The test is the
correlation of the two 10 ms energy envelopes over the last two seconds,
at the best of the delays up to 600 ms, after each envelope has had its
own 150 ms moving average taken away. What is left is the syllables' rise
and fall, which an echo repeats. The level itself would also correlate
with a caller who starts talking over the agent on a clean line: that is
one step up in the near end's level, and whenever the agent happened to
be louder after the step than before it, the plain envelopes gave 0.7-0.83
(found as echo in 49 of 250 simulated barge-ins, and in a CI run).

Once echo is found its delay is still followed: a phone's jitter buffer
grows and shrinks, a transfer puts another phone on the line. A new delay
counts once two judgements running agree on it (200 ms), and the
canceller's tail and its residual-echo check (audio/residual_echo.py) use
the delay as it is now.

With echo found, the line's echo return (how much louder or quieter the
echo comes back than the agent was sent, the median over the window) says
how loud the echo can be now: the agent's loudest chunk within 120 ms of
the delay found, plus that return. Near-end audio well above it is not
the echo alone: the caller is speaking (``beyond_echo_db``). AEC3 may let
an echo through while it re-learns a moved path, but the echo's level on
the line stays what it was, so this holds when the canceller does not.
The return is measured only by a judgement that finds the echo where it
is known to be, and the highest of the last three seconds' measurements
is used: the ways the measurement was seen to go wrong put it low. A
delay that has stepped pairs the echo with the wrong syllables while the
window holds both delays; once the agent stops, the last of its speech in
the window is its fade-out, whose echo can come back far quieter. In
calls the return measured went from -5.7 to -8.9 dB that way, or from +1
to -5 dB in the second before the next reply; that reply's echo then
came out 4-8 dB louder than the echo could be, and cut it. A near-end
chunk too quiet for anyone speaking is never the caller: after the
agent's last word the echo predicted falls below the line's idle values.
"""

from __future__ import annotations

from collections import deque

import numpy as np

CHUNK_S = 0.01
WINDOW = 200  # 10 ms chunks: the last two seconds
MAX_LAG = 60  # 600 ms: longer than any echo delay AEC3 handles
LAG_STEP = 2
EVERY = 10  # decide every 100 ms
# Far-end chunks at least this loud (dB of int16 mean square, about
# -50 dBFS) count as the agent speaking.
FAR_ACTIVE_DB = 40.0
# Enough of the agent's speech in the window to judge by (half a second).
MIN_ACTIVE = 50
# The moving average taken from each envelope: 150 ms, about a syllable
# (100 and 90 ms lost echoes under double talk in simulation, 250 ms let
# barge-ins through again).
SMOOTHING = 15
# Echo: envelopes this alike, at about the same delay, twice running (in
# simulation, 336 echo paths of -25 to 0 dB and 40-550 ms, some with the
# caller talking over them, reached 0.84-0.98 at best; 442 barge-ins on a
# clean line reached 0.62-0.68 at most, once, at delays that wander).
ECHO_CORRELATION = 0.7
SAME_DELAY = 4  # chunks (40 ms)
ECHO_STREAK = 2
# No echo: below this, three judgements (300 ms) running, and the caller's
# end quiet (under FAR_ACTIVE_DB) through most of the agent's speech in the
# window. A speakerphone's end is never quiet while the agent speaks, so a
# poor correlation there (double talk, loss) can never pass for "no echo".
NO_ECHO_CORRELATION = 0.5
NO_ECHO_STREAK = 3
QUIET_SHARE = 0.7
# The echo's return: the highest of this many measurements (one a judgement
# that found the echo at its delay, while the agent speaks: three seconds).
RETURN_MEMORY = 30
# The delays around the one found that the echo's level is taken from: it
# may have stepped 120 ms either way since (as audio/residual_echo.py).
LEVEL_SPREAD = 12
# Near-end chunks quieter than the agent speaking (about -50 dBFS) are
# nobody speaking: once the agent has paused for longer than the spread
# above, the echo predicted falls below even G.711's idle values.
NEAR_SPEAKING_DB = FAR_ACTIVE_DB


def energy_db(chunk: np.ndarray) -> float:
    samples = chunk.astype(np.float64)
    return float(10.0 * np.log10(np.mean(samples * samples) + 1.0))


class EchoPresence:
    def __init__(self) -> None:
        self._far = np.zeros(WINDOW)
        self._near = np.zeros(WINDOW)
        self._filled = 0
        self._count = 0
        # None: not judged yet (treated as echo); True: seen, for the rest of the call.
        self.echo: bool | None = None
        self.best_correlation = 0.0
        self._echo_lag: int | None = None  # delay of the last echo-like judgement
        self._echo_streak = 0
        self._quiet_streak = 0
        self._candidate: int | None = None  # a new delay seen once, once echo is found
        self.delay_changes = 0
        # The echo's level against the agent's (dB, the median near less far
        # at the delay found over the window's agent speech), once echo is found.
        self.echo_return_db: float | None = None
        self._returns: deque[float] = deque(maxlen=RETURN_MEMORY)

    @property
    def echo_delay_chunks(self) -> int:
        """How long the echo takes to come back, in 10 ms chunks: as found,
        or the longest delay tried while none has been."""
        return MAX_LAG if self._echo_lag is None or self.echo is not True else self._echo_lag

    @property
    def cancel(self) -> bool:
        """Whether the canceller's output should be used now."""
        return self.echo is not False

    def push(self, far: np.ndarray, near: np.ndarray) -> None:
        """One 10 ms chunk of each end, lined up as the canceller sees them."""
        slot = self._count % WINDOW  # a ring: the oldest entry is overwritten
        self._far[slot], self._near[slot] = energy_db(far), energy_db(near)
        self._filled = min(WINDOW, self._filled + 1)
        self._count += 1
        if self._count % EVERY:
            return
        judged = self._best_correlation()
        if judged is None:
            return  # too little of the agent's speech to judge by
        correlation, lag = judged
        self.best_correlation = correlation
        if self.echo is True:
            self._track(correlation, lag)
            if correlation >= ECHO_CORRELATION and self._at_echo_delay(lag):
                self._measure_return()
            return
        if correlation >= ECHO_CORRELATION:
            same = self._echo_lag is not None and abs(lag - self._echo_lag) <= SAME_DELAY
            self._echo_streak = self._echo_streak + 1 if same else 1
            self._echo_lag, self._quiet_streak = lag, 0
            if self._echo_streak >= ECHO_STREAK:
                self.echo = True
                self._measure_return()
        else:
            self._echo_streak, self._echo_lag = 0, None
            quiet = correlation < NO_ECHO_CORRELATION and self._caller_quiet()
            self._quiet_streak = self._quiet_streak + 1 if quiet else 0
            if self._quiet_streak >= NO_ECHO_STREAK:
                self.echo = False

    def _track(self, correlation: float, lag: int) -> None:
        """Echo found: follow its delay as it changes (a phone's jitter
        buffer growing or shrinking, a transfer). A new delay counts once
        two judgements running agree on it."""
        if correlation < ECHO_CORRELATION:
            self._candidate = None
            return
        if self._at_echo_delay(lag):
            self._candidate = None
            return
        if self._candidate is not None and abs(lag - self._candidate) <= SAME_DELAY // 2:
            self._echo_lag, self._candidate = lag, None
            self.delay_changes += 1
            return
        self._candidate = lag

    def _at_echo_delay(self, lag: int) -> bool:
        return self._echo_lag is not None and abs(lag - self._echo_lag) <= SAME_DELAY // 2

    def _measure_return(self) -> None:
        """The echo's level against the agent's, at the delay found: the
        median now, the highest of the last RETURN_MEMORY kept."""
        assert self._echo_lag is not None
        far, near = self._window()
        lag = self._echo_lag
        sent, heard = far[: len(far) - lag], near[lag:]
        active = sent >= FAR_ACTIVE_DB
        if int(active.sum()) >= MIN_ACTIVE:
            self._returns.append(float(np.median(heard[active] - sent[active])))
            self.echo_return_db = max(self._returns)

    def beyond_echo_db(self) -> float | None:
        """How far (dB) the latest near-end chunk is above the loudest echo
        the agent's audio could make of it; None until echo is found, and
        for a chunk too quiet to be anyone speaking."""
        if self.echo is not True or self.echo_return_db is None or self._echo_lag is None:
            return None
        latest = self._count - 1
        if self._near[latest % WINDOW] < NEAR_SPEAKING_DB:
            return None
        nearest = max(0, self._echo_lag - LEVEL_SPREAD)
        farthest = min(self._echo_lag + LEVEL_SPREAD, self._filled - 1)
        if farthest < nearest:
            return None
        ago = np.arange(nearest, farthest + 1)
        loudest = float(self._far[(latest - ago) % WINDOW].max())
        return float(self._near[latest % WINDOW]) - (loudest + self.echo_return_db)

    def _window(self) -> tuple[np.ndarray, np.ndarray]:
        """The envelopes in the window, oldest first."""
        if self._filled < WINDOW:
            return self._far[: self._filled], self._near[: self._filled]
        start = self._count % WINDOW
        return np.roll(self._far, -start), np.roll(self._near, -start)

    def _caller_quiet(self) -> bool:
        far, near = self._window()
        active = far >= FAR_ACTIVE_DB
        return float(np.mean(near[active] < FAR_ACTIVE_DB)) >= QUIET_SHARE

    def _best_correlation(self) -> tuple[float, int] | None:
        """The best envelope correlation over the delays, and its delay."""
        far, near = self._window()
        # Judge only once enough of the agent's speech is old enough for its
        # echo to be back even at the longest delay: early on, only the short
        # delays could be tried, and a real echo would be missed.
        if int((far[: max(0, len(far) - MAX_LAG)] >= FAR_ACTIVE_DB).sum()) < MIN_ACTIVE:
            return None
        # Every delay at once: row k pairs the near end at t with the far
        # end at t - lags[k], for t over the same span (the window less the
        # longest delay). A delay counts only if the agent spoke for long
        # enough in its rows; the correlation then runs over the whole span,
        # silences included, which an echo follows too and a caller does not.
        lags = np.arange(0, MAX_LAG + 1, LAG_STEP)
        span = len(far) - MAX_LAG
        far_shape, near_shape = _syllables(far), _syllables(near)
        rows = [slice(MAX_LAG - lag, MAX_LAG - lag + span) for lag in lags]
        usable = np.array([int((far[row] >= FAR_ACTIVE_DB).sum()) >= MIN_ACTIVE for row in rows])
        sent = np.stack([far_shape[row] for row in rows])
        heard = near_shape[MAX_LAG:]
        sent = sent - sent.mean(axis=1, keepdims=True)
        heard = heard - heard.mean()
        covariance = sent @ heard / span
        spread = np.sqrt((sent * sent).mean(axis=1) * float((heard * heard).mean()))
        # A near end that does not move at all (digital silence) is no echo.
        values = np.where(spread > 1e-6, covariance / np.maximum(spread, 1e-6), 0.0)
        # The longest delay's row is the span checked above, so at least
        # one delay is usable and the best is a real judgement.
        values[~usable] = -1.0
        best = int(np.argmax(values))
        return float(values[best]), int(lags[best])


def _syllables(envelope: np.ndarray) -> np.ndarray:
    """An envelope less its own centred moving average (edges held)."""
    padded = np.pad(envelope, (SMOOTHING // 2, SMOOTHING - SMOOTHING // 2 - 1), mode="edge")
    return envelope - np.convolve(padded, np.ones(SMOOTHING) / SMOOTHING, mode="valid")
