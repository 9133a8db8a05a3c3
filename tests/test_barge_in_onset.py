"""Speech over a reply pauses it from its third voiced frame, before the
turn it may start is certain (100 ms): a click that stops sooner lets the
reply go on after two quiet frames; speech that becomes a turn keeps it
paused until the turn is judged. On the real outbound track, and in a
session whose turns become manual mid-onset. A burst heard only where the
reply's own echo may be is told apart from one heard where it cannot."""

from __future__ import annotations

from voice_agent.rtc.outbound import PacedAudioTrack
from voice_agent.session.barge_in import BargeIn

ONSET_PAUSE_FRAMES = 3  # the default: 60 ms


class ReplyStandIn:
    """The paused reply: only its cancellation is asked of it here."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, reason: str) -> None:
        self.cancelled.append(reason)


def test_a_click_pauses_the_reply_for_a_frame_and_it_goes_on() -> None:
    output = PacedAudioTrack()
    barge_in = BargeIn(output, min_voiced_ms=500, session_id="s")
    for _ in range(ONSET_PAUSE_FRAMES - 1):
        barge_in.onset_frame(True)
    assert not output.paused  # 40 ms: not yet
    barge_in.onset_frame(True)
    assert output.paused  # 60 ms of speech over the reply: quiet from the next frame
    barge_in.onset_frame(False)  # one quiet frame: a turn may still start (it forgives one)
    assert output.paused
    barge_in.onset_frame(True)
    barge_in.onset_frame(False)
    barge_in.onset_frame(False)  # two in a row: it stopped before a turn began
    assert not output.paused and barge_in.onsets_lifted == 1
    # Voiced frames that are not in a row do not add up.
    for voiced in (True, True, False, True, True, False):
        barge_in.onset_frame(voiced)
        assert not output.paused


def test_speech_that_becomes_a_turn_keeps_the_reply_paused_until_it_is_judged() -> None:
    output = PacedAudioTrack()
    barge_in = BargeIn(output, min_voiced_ms=500, session_id="s")
    reply = ReplyStandIn()
    for _ in range(ONSET_PAUSE_FRAMES):
        barge_in.onset_frame(True)
    assert barge_in.hold(reply, generation=1)  # type: ignore[arg-type]
    assert output.paused
    barge_in.onset_frame(False)  # frames the turn holds are no longer the onset's
    barge_in.onset_frame(False)
    assert output.paused
    barge_in.release("a cough")
    assert not output.paused and reply.cancelled == []
    # Again, and this time an interruption: cancelled, the track plays on.
    for _ in range(ONSET_PAUSE_FRAMES):
        barge_in.onset_frame(True)
    assert barge_in.hold(reply, generation=2)
    barge_in.confirm()
    assert reply.cancelled == ["turn_detected"] and not output.paused


def test_a_reply_that_ends_during_an_onset_pause_leaves_the_track_playing() -> None:
    output = PacedAudioTrack()
    barge_in = BargeIn(output, min_voiced_ms=500, session_id="s")
    for _ in range(ONSET_PAUSE_FRAMES):
        barge_in.onset_frame(True)
    barge_in.finished(ReplyStandIn())  # type: ignore[arg-type]
    assert not output.paused


def test_with_no_minimum_the_onset_does_not_pause() -> None:
    output = PacedAudioTrack()
    barge_in = BargeIn(output, min_voiced_ms=0, session_id="s")  # the turn cancels at once
    for _ in range(ONSET_PAUSE_FRAMES + 2):
        barge_in.onset_frame(True)
    assert not output.paused


def test_turns_taken_by_hand_mid_onset_leave_the_reply_playing() -> None:
    output = PacedAudioTrack()
    barge_in = BargeIn(output, min_voiced_ms=500, session_id="s")
    for _ in range(ONSET_PAUSE_FRAMES):
        barge_in.onset_frame(True)
    assert output.paused
    barge_in.release("turn abandoned")  # the session went to push-to-talk
    assert not output.paused


def burst_over_a_reply(echo_may_return: bool) -> tuple[PacedAudioTrack, BargeIn, ReplyStandIn]:
    """Speech over a reply for 100 ms, heard where the reply's echo may (or
    may not) be: the reply held for it."""
    output = PacedAudioTrack()
    barge_in = BargeIn(output, min_voiced_ms=500, session_id="s")
    reply = ReplyStandIn()
    for _ in range(5):
        barge_in.frame_heard(True, echo_may_return=echo_may_return)
        barge_in.onset_frame(True)
    assert barge_in.hold(reply, generation=1)  # type: ignore[arg-type]
    return output, barge_in, reply


def test_a_burst_heard_only_while_the_replys_echo_could_return_may_be_that_echo() -> None:
    # On a line that echoes, the reply falls quiet at the onset and its
    # echo ends one delay later: a burst that ends within that window may
    # be the echo the canceller let through, whatever words it held.
    output, barge_in, reply = burst_over_a_reply(echo_may_return=True)
    for voiced in (True, True, False, False):
        barge_in.frame_heard(voiced, echo_may_return=True)
    for _ in range(10):  # the echo's delay is over: quiet
        barge_in.frame_heard(False, echo_may_return=False)
    assert barge_in.own_echo()
    barge_in.release("own echo")
    assert not barge_in.own_echo() and not output.paused and reply.cancelled == []


def test_a_caller_heard_after_the_echo_could_return_is_not_taken_for_it() -> None:
    _, barge_in, _ = burst_over_a_reply(echo_may_return=True)
    barge_in.frame_heard(True, echo_may_return=True)
    assert barge_in.own_echo()  # so far, it could be
    barge_in.frame_heard(True, echo_may_return=False)  # still speaking once no echo can be
    assert not barge_in.own_echo()
    barge_in.frame_heard(False, echo_may_return=True)  # (the agent is not playing again)
    assert not barge_in.own_echo()


def test_on_a_line_without_echo_no_burst_is_taken_for_echo() -> None:
    _, barge_in, _ = burst_over_a_reply(echo_may_return=False)
    assert not barge_in.own_echo()  # even before another frame is heard
