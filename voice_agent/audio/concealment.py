"""Packet-loss concealment for the caller's G.711 audio, in the manner of
ITU-T G.711 Appendix I, before the VAD and the STT hear it.

A lost packet left as a hole spliced out of the caller's audio makes the
STT hear every syllable around it 20 ms shorter, its formant transitions
cut; a zero-filled hole is a click in every word instead. Voiced
speech is nearly periodic over a few tens of milliseconds, so the last
pitch period repeated is a good guess for a short gap: what a phone's
receiver does, and what Appendix I specifies for G.711, which has no
concealment of its own.

What is kept from Appendix I:

- 48.75 ms of history (three of the longest pitch periods and a quarter);
- the pitch period from the normalised autocorrelation of the last 20 ms,
  over lags of 5 to 15 ms (200 Hz down to 67 Hz);
- one period repeated for the first 10 ms of a loss, then the last two,
  then the last three periods (a single period repeated for long sounds
  buzzy; older periods make it sound like a voice);
- a quarter-period overlap-add where the real signal hands over to the
  repeated one, and at each of those switches;
- from the second 10 ms on, a linear fade of 20 % per 10 ms: silence from
  60 ms (a repeated guess held longer is a tone, which the VAD would take
  for speech and the STT for a word);
- where the packet after the gap is not at hand (below), an overlap-add
  from the repeated signal into it, a quarter period plus 4 ms for every
  further 10 ms lost (up to 10 ms).

The quarter-period overlap-add at the start rewrites the last samples
before the loss, which therefore cannot have been passed on yet: every
sample leaves DELAY (30 samples, 3.75 ms) late, the appendix's own delay.
Positions stay exact (the caller of ``good``/``lost`` stamps the output
with ``held``), only the hand-over is later.

A loss is found when the packet after it arrives, so that packet is at
hand when the gap is filled (``lost(..., following=...)``): its first pitch
period, repeated backwards, is a guess for the gap's end as good as the
last period is for its start, and the two are cross-faded over the gap.
An interpolation instead of an extrapolation: the gap ends where the next
syllable begins rather than in a fade of the last one, at no added delay.
Its first period is estimated on the packet alone where it is 20 ms or
longer (windows of 5 to 15 ms), or else taken from before the gap; a
quarter-period overlap-add at the packet's start, Appendix I's seam
mirrored in time, makes the join.

Gaps longer than MAX_CONCEALED_MS are no loss a listener fills in (a stream
restarted, a pause in sending): the decoder does not conceal them
(``restart``).
"""

from __future__ import annotations

import numpy as np

RATE = 8_000
STEP = RATE // 100  # Appendix I's 10 ms: its schedule is counted in these
PITCH_MIN = RATE // 200  # 5 ms: 200 Hz
PITCH_MAX = RATE * 15 // 1000  # 15 ms: 67 Hz
DELAY = PITCH_MAX // 4  # the longest quarter-period overlap-add: 3.75 ms
HISTORY = 3 * PITCH_MAX + DELAY  # 48.75 ms
CORRELATED = 2 * STEP  # the last 20 ms are matched against the lagged signal
MAX_PERIODS = 3
FADE_PER_STEP = 0.2  # from the second 10 ms on
SILENT_AFTER = STEP + round(STEP / FADE_PER_STEP)  # 60 ms
END_OVERLAP_STEP = RATE * 4 // 1000  # the end overlap grows 4 ms per 10 ms lost
MAX_CONCEALED_MS = 120
LEADING_WINDOW_MIN = STEP // 2  # 5 ms: the least audio a lag of the next packet is judged on
LEADING_MIN = PITCH_MAX + LEADING_WINDOW_MIN  # 20 ms: a shorter packet is not searched


def _ramp(length: int) -> np.ndarray:
    """Weights rising from 0 to 1 over ``length`` samples (neither end
    reached: both signals count at every sample of the overlap)."""
    return (np.arange(length, dtype=np.float64) + 0.5) / length


def pitch_period(history: np.ndarray) -> int:
    """The lag (in samples, PITCH_MIN to PITCH_MAX) at which the last 20 ms
    best match the signal before them, by normalised cross-correlation:
    without the normalisation a loud syllable one lag back would outweigh
    the period itself."""
    signal = history.astype(np.float64)
    recent = signal[-CORRELATED:]
    lags = np.arange(PITCH_MIN, PITCH_MAX + 1)
    # Row i: the 20 ms that ended lags[i] samples before the end.
    windows = np.lib.stride_tricks.sliding_window_view(signal[:-PITCH_MIN], CORRELATED)
    lagged = windows[len(windows) - 1 - (lags - PITCH_MIN)]
    energy = np.einsum("ij,ij->i", lagged, lagged)
    score = (lagged @ recent) / np.sqrt(np.maximum(energy, 1e-9))
    return int(lags[int(np.argmax(score))])


def leading_pitch_period(signal: np.ndarray) -> int | None:
    """The lag at which the start of ``signal`` (the packet after a loss)
    best matches itself a lag later, over all of it that overlaps; None
    when it is too short to try every lag (LEADING_MIN, 20 ms) on 5 ms or
    more: a 10 ms packet would only be tried on lags up to 5 ms and
    repeat half of a man's period."""
    values = signal.astype(np.float64)
    if len(values) < LEADING_MIN:
        return None
    lags = np.arange(PITCH_MIN, PITCH_MAX + 1)
    # Per lag: the products of the samples with those a lag later, and the
    # energies of the two overlapping stretches.
    products = np.correlate(values, values, mode="full")[len(values) - 1 + lags]
    squares = np.concatenate(([0.0], np.cumsum(values**2)))
    early = squares[len(values) - lags]
    late = squares[-1] - squares[lags]
    score = products / np.sqrt(np.maximum(early * late, 1e-9))
    return int(lags[int(np.argmax(score))])


def backward_extension(
    following: np.ndarray, count: int, period_before: int | None = None
) -> tuple[np.ndarray, np.ndarray] | None:
    """``count`` samples leading up to ``following``: its first pitch period
    repeated backwards, faded out away from it as Appendix I fades its
    repetition (none in the first 10 ms, then 20 % every 10 ms); and
    ``following`` with its first quarter period blended towards the samples
    a period later, so that the repetition joins it without a step. A
    packet too short to find its period in takes ``period_before`` (the
    gap's other side: a voice's pitch moves little in a few tens of
    milliseconds); None when there is neither, or the packet is shorter
    than the period."""
    period = leading_pitch_period(following) or period_before
    if not period or len(following) < period:
        return None
    signal = following.astype(np.float64)
    overlap = min(period // 4, len(signal) - period)
    joined = signal.copy()
    if overlap:
        rise = _ramp(overlap)
        joined[:overlap] = signal[:overlap] * rise + signal[period : period + overlap] * (1 - rise)
    # Position -k before the packet repeats the (joined) first period.
    index = (-np.arange(count, 0, -1)) % period
    extension = joined[:period][index] * _reversed_gain(count)
    return extension, _to_int16(joined)


def _reversed_gain(count: int) -> np.ndarray:
    """Appendix I's fade, counted back from the end of ``count`` samples."""
    gain: np.ndarray = np.ones(count) * _gain(0, count)
    return gain[::-1]


class G711Concealer:
    """One stream's 8 kHz samples in, the same delayed by DELAY out, lost
    stretches filled in. ``good`` takes audio that arrived, ``lost`` the
    length of audio that did not; both return the samples now ready, the
    ``held`` newest ones kept back."""

    def __init__(self) -> None:
        self._forget()

    def _forget(self) -> None:
        self._history = np.zeros(0, dtype=np.int16)  # newest last, DELAY of it unsent
        self.held = 0  # samples at the end of the history not yet returned
        self._erased = 0  # samples concealed in the loss in progress (0: none)
        self._source: np.ndarray | None = None  # the periods repeated (None: too little history)
        self._period = 0
        self._overlap = 0
        self._periods = 1  # how many of the last periods are repeated now
        self._position = 0  # where in them the next sample comes from
        self._fading = 0  # samples of the hand-over to more periods still to mix
        self._old_periods = 1  # ...and the repetition being handed over from
        self._old_position = 0
        self._joined: np.ndarray | None = None  # the next good packet, already joined to a gap

    def good(self, samples: np.ndarray) -> np.ndarray:
        """Audio that arrived (int16); after a loss its start is mixed with
        the concealment's continuation, so the seam makes no click."""
        if self._joined is not None and len(self._joined) == len(samples):
            # The gap before was filled up to these samples already.
            samples, self._erased, self._fading = self._joined, 0, 0
        elif self._erased:
            samples = self._merge(samples)
        self._joined = None
        return self._append(samples)

    def lost(self, count: int, following: np.ndarray | None = None) -> np.ndarray:
        """``count`` samples that never arrived, filled in: from the audio
        before them, and from ``following`` too where it is given (the
        packet that arrived after them, which ``good`` takes next)."""
        if count <= 0:
            return np.zeros(0, dtype=np.int16)
        if not self._erased:
            self._begin()
        filled = self._synthesise(count)
        self._joined = None
        before = self._period if self._source is not None else None
        ahead = None if following is None else backward_extension(following, count, before)
        if ahead is not None:
            extension, self._joined = ahead
            towards = _ramp(count)
            filled = filled * (1 - towards) + extension * towards
        return self._append(_to_int16(filled))

    def restart(self) -> np.ndarray:
        """The held samples, and nothing remembered: what comes next is a
        new stream (a gap too long to conceal, a timestamp jump)."""
        rest = self.flush()
        self._forget()
        return rest

    def flush(self) -> np.ndarray:
        """The held samples: the stream has ended."""
        rest = self._history[len(self._history) - self.held :].copy()
        self.held = 0
        self._joined = None
        return rest

    # -- internals ----------------------------------------------------------
    def _append(self, samples: np.ndarray) -> np.ndarray:
        joined = np.concatenate((self._history, samples.astype(np.int16, copy=False)))
        pending = self.held + len(samples)
        ready = max(0, pending - DELAY)
        start = len(joined) - pending
        out = joined[start : start + ready]
        self.held = pending - ready
        self._history = joined[-HISTORY:]
        return out

    def _begin(self) -> None:
        history = self._history.astype(np.float64)
        if len(history) < CORRELATED + PITCH_MAX:
            # The stream has barely started: nothing to repeat. Silence,
            # and the audio after it fades in.
            self._source = None
            self._overlap = DELAY
            return
        period = pitch_period(history)
        # The hand-over can only rewrite samples not yet passed on.
        overlap = min(period // 4, self.held)
        periods = min(MAX_PERIODS, (len(history) - overlap) // period)
        source = history[-(periods * period + overlap) :].copy()
        if overlap:
            # The real signal's last quarter period fades into the one a
            # period before it, so that it ends where a repetition of the
            # last period starts: no step at the seam, nor at each wrap.
            rise = _ramp(overlap)
            end = len(source)
            source[end - overlap :] = (
                source[end - overlap :] * (1 - rise)
                + source[end - period - overlap : end - period] * rise
            )
            self._history[-overlap:] = _to_int16(source[end - overlap :])
        self._source = source[overlap:] if overlap else source  # whole periods
        self._period, self._overlap, self._periods = period, max(overlap, 1), 1
        self._position = (periods - 1) * period  # the start of the last period
        self._fading = 0

    def _repeat(self, periods: int, position: int, count: int) -> tuple[np.ndarray, int]:
        """``count`` samples of the last ``periods`` periods, repeated from
        ``position`` (an index into all of them), and where that ends."""
        assert self._source is not None
        span = periods * self._period
        offset = len(self._source) - span
        index = offset + (position - offset + np.arange(count)) % span
        return self._source[index], offset + (position - offset + count) % span

    def _synthesise(self, count: int) -> np.ndarray:
        out = np.zeros(count, dtype=np.float64)
        done = 0
        while done < count:
            erased = self._erased
            if erased >= SILENT_AFTER or self._source is None:
                self._erased += count - done
                break
            boundary = next(b for b in (STEP, 2 * STEP, SILENT_AFTER) if b > erased)
            length = min(count - done, boundary - erased)
            piece, self._position = self._repeat(self._periods, self._position, length)
            if self._fading:
                mixed = min(length, self._fading)
                old, self._old_position = self._repeat(self._old_periods, self._old_position, mixed)
                rise = _ramp(self._overlap)[self._overlap - self._fading :][:mixed]
                piece[:mixed] = old * (1 - rise) + piece[:mixed] * rise
                self._fading -= mixed
            out[done : done + length] = piece * _gain(erased, length)
            done += length
            self._erased += length
            if self._erased in (STEP, 2 * STEP):
                self._more_periods()
        return out

    def _more_periods(self) -> None:
        """Older periods join the repetition; the same place one period
        further back is where it goes on, mixed in over a quarter period."""
        assert self._source is not None
        available = len(self._source) // self._period
        if self._periods >= min(MAX_PERIODS, available):
            return
        self._old_periods, self._old_position = self._periods, self._position
        self._periods += 1
        self._position -= self._period
        self._fading = self._overlap

    def _merge(self, samples: np.ndarray) -> np.ndarray:
        """The first good audio after a loss, its start mixed with the
        concealment going on: longer losses get a longer hand-over, their
        guess having drifted further from the real signal."""
        lost_steps = -(-self._erased // STEP)
        length = min(len(samples), STEP, self._overlap + END_OVERLAP_STEP * max(0, lost_steps - 1))
        if length:
            going_on = self._synthesise(length)
            rise = _ramp(length)
            mixed = samples.astype(np.float64)
            mixed[:length] = going_on * (1 - rise) + mixed[:length] * rise
            samples = _to_int16(mixed)
        self._erased = 0
        self._fading = 0
        return samples


def _gain(erased: int, count: int) -> np.ndarray | float:
    """The fade for ``count`` samples from ``erased`` into a loss: none in
    the first 10 ms, then 20 % less every 10 ms."""
    if erased + count <= STEP:
        return 1.0
    at = erased + np.arange(count, dtype=np.float64)
    return np.clip(1.0 - FADE_PER_STEP * (at - STEP) / STEP, 0.0, 1.0)


def _to_int16(samples: np.ndarray) -> np.ndarray:
    rounded: np.ndarray = np.clip(np.rint(samples), -32768, 32767)
    return rounded.astype(np.int16)
