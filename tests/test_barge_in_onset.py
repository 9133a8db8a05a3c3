"""Speech over a reply pauses it from its third voiced frame, before the
turn it may start is certain (100 ms): a click that stops sooner lets the
reply go on after two quiet frames; speech that becomes a turn keeps it
paused until the turn is judged. On the real outbound track, and in a
session whose turns become manual mid-onset."""

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
