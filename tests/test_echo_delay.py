"""An echo path whose delay moves mid-call (a phone's jitter buffer growing
or shrinking, a transfer): the canceller follows the delay, and the echo
AEC3 lets through while it re-learns the path is not passed on as speech
(offline, on recorded speech, the way a call feeds the canceller)."""

from __future__ import annotations

import numpy as np
import pytest
import webrtcvad

from tests.test_echo import level_db, run_canceller
from voice_agent.audio.echo import CALLER_OVER_ECHO_DB
from voice_agent.audio.echo_presence import EchoPresence
from voice_agent.testing.audio_data import librivox, telephone_prompt

RATE = 16_000
STEP_AT_S = 6.0
LENGTH_S = 12.0


def stepped_room_echo(far: np.ndarray, before_s: float, after_s: float) -> np.ndarray:
    """A speakerphone's echo (6 dB down, three reflections) whose delay
    steps from ``before_s`` to ``after_s`` at STEP_AT_S."""
    room = np.zeros(640)
    room[[0, 112, 304, 528]] = [1.0, 0.45, -0.25, 0.12]
    wet = np.convolve(far, room)[: len(far)] * 0.5
    echo = np.zeros(len(far))
    step = int(STEP_AT_S * RATE)
    for start, end, delay_s in ((0, step, before_s), (step, len(far), after_s)):
        at = np.arange(start, end)
        source = at - int(delay_s * RATE)
        echo[at[source >= 0]] = wet[source[source >= 0]]
    return echo


def longest_speech_ms(samples: np.ndarray) -> int:
    """The longest run the service's default VAD (webrtcvad, mode 3) hears as speech."""
    vad = webrtcvad.Vad(3)
    longest = run = 0
    for start in range(0, len(samples) - 320 + 1, 320):
        if vad.is_speech(samples[start : start + 320].tobytes(), RATE):
            run += 1
            longest = max(longest, run)
        else:
            run = 0
    return longest * 20


@pytest.mark.parametrize(("before_s", "after_s"), [(0.20, 0.16), (0.20, 0.24), (0.12, 0.08)])
def test_a_delay_step_of_40_ms_is_followed_and_its_echo_not_heard_as_speech(
    before_s: float, after_s: float
) -> None:
    speech = np.concatenate([librivox(c) for c in ("0870", "0880", "0890", "0920", "0930")])
    end = int(LENGTH_S * RATE)
    far = np.zeros(end + RATE)
    far[:end] = speech[:end]
    echo = stepped_room_echo(far, before_s, after_s)
    line = np.random.default_rng(0).normal(0, 30, len(far))
    near = np.clip(echo + line, -32768, 32767).astype(np.int16)
    far16 = far.astype(np.int16)
    just_before = int((STEP_AT_S - 0.1) * RATE)
    _, before = run_canceller(far16[:just_before], near[:just_before], [1, 3, 1, 2] * 2000)
    out, canceller = run_canceller(far16, near, [1, 3, 1, 2] * 2000)

    # The delay found moved with the echo, by 40 ms (4 chunks), either way.
    moved = canceller.presence.echo_delay_chunks - before.presence.echo_delay_chunks
    assert moved == round((after_s - before_s) * 100), moved
    assert canceller.stats.delay_changes >= 1
    # While AEC3 re-learns the path, what it lets through is attenuated:
    # without that, 2-10 dB were removed for 2-3 s after the step and the
    # echo passed as 380-560 ms of "speech" (a false barge-in).
    after = slice(int(STEP_AT_S * RATE), int((STEP_AT_S + 3.0) * RATE))
    assert level_db(near[after]) - level_db(out[after]) >= 8.0
    assert longest_speech_ms(out[RATE:end]) <= 300


@pytest.mark.parametrize("after_s", [0.16, 0.24])
def test_echo_after_a_step_is_still_taken_for_echo_and_a_caller_over_it_is_not(
    after_s: float,
) -> None:
    # What the barge-in rule is told (session/barge_in.py): the echo the
    # canceller lets through after a step is no louder on the line than
    # before it, so it may still be the agent's own echo; a caller's "no"
    # over the agent is louder than any echo could be.
    speech = np.concatenate([librivox(c) for c in ("0870", "0880", "0890")])
    end = int(LENGTH_S * RATE)
    far = np.zeros(end + RATE)
    far[:end] = speech[:end]
    echo = stepped_room_echo(far, 0.20, after_s)
    caller = np.zeros(len(far))
    said = telephone_prompt("no").astype(np.float64)
    at = int(9.0 * RATE)
    caller[at : at + len(said)] = said
    line = np.random.default_rng(0).normal(0, 30, len(far))
    frames: dict[int, bool] = {}
    for with_caller in (False, True):
        near = np.clip(echo + line + (caller if with_caller else 0), -32768, 32767)
        frames.clear()
        run_canceller(
            far.astype(np.int16), near.astype(np.int16), [1, 3, 1, 2] * 900, may_return=frames
        )
        speaking = [i for i in frames if at <= i * 320 < at + len(said)]
        if not with_caller:
            # From the echo's first judgement to the agent's end, steps included.
            playing = [i for i in frames if 3 * RATE <= i * 320 < end]
            assert playing and all(frames[i] for i in playing)
        else:
            louder = [i for i in speaking if not frames[i]]
            assert len(louder) >= 3, (len(louder), len(speaking))


def test_the_echos_level_is_not_measured_from_a_reply_end_that_never_came_back() -> None:
    # The last half second of a reply lost on its way to the phone: nothing
    # of it comes back. As the agent's speech slides out of the window,
    # that end was all that was left to measure the echo's level by, and
    # its silence put the level 36 dB low: the next reply's echo was then
    # louder than the echo could be, and taken for the caller.
    first = librivox("0870")[: 4 * RATE].astype(np.float64)
    second = librivox("0890")[: 3 * RATE].astype(np.float64)
    gap = np.zeros(2 * RATE)
    far = np.concatenate([first, gap, second, gap])
    delay = int(0.26 * RATE)
    echo = np.zeros(len(far))
    echo[delay:] = far[: len(far) - delay]
    lost = slice(len(first) - RATE // 2 + delay, len(first) + delay)
    echo[lost] = 0.0
    near = echo + np.random.default_rng(0).normal(0, 30, len(far))
    presence = EchoPresence()
    second_echo = range(len(first) + len(gap) + delay, len(first) + len(gap) + len(second) + delay)
    taken_for_the_caller = 0
    for at in range(0, len(far) - 160 + 1, 160):
        presence.push(far[at : at + 160], near[at : at + 160])
        beyond = presence.beyond_echo_db()
        if at in second_echo and beyond is not None and beyond >= CALLER_OVER_ECHO_DB:
            taken_for_the_caller += 1
    assert presence.echo is True
    assert taken_for_the_caller == 0


def test_after_the_agents_last_word_only_someone_speaking_is_louder_than_its_echo() -> None:
    # Once the agent has stopped, the loudest echo it could make falls to
    # nothing, below even the line's idle noise: that noise is nobody, and
    # the caller's voice is the caller.
    speech = librivox("0870")[: 4 * RATE].astype(np.float64)
    caller = telephone_prompt("no").astype(np.float64)
    far = np.concatenate([speech, np.zeros(RATE + len(caller))])
    delay = int(0.2 * RATE)
    near = np.zeros(len(far))
    near[delay:] = far[: len(far) - delay] * 0.5
    near += np.random.default_rng(0).normal(0, 3, len(far))  # G.711's idle values
    caller_at = len(speech) + RATE
    near[caller_at : caller_at + len(caller)] += caller
    presence = EchoPresence()
    idle: list[float | None] = []
    speaking: list[float | None] = []
    for at in range(0, len(far) - 160 + 1, 160):
        presence.push(far[at : at + 160], near[at : at + 160])
        if len(speech) + delay + RATE // 2 <= at < caller_at:
            idle.append(presence.beyond_echo_db())
        elif caller_at <= at < caller_at + len(caller):
            speaking.append(presence.beyond_echo_db())
    assert presence.echo is True
    assert idle and all(beyond is None for beyond in idle)
    assert sum(1 for b in speaking if b is not None and b >= CALLER_OVER_ECHO_DB) >= 5
