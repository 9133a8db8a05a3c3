"""Echo handling for legs without acoustic echo cancellation.

A real aiortc client acts as a speakerphone (voice_agent.client.SimulatedEcho):
what it receives comes back into its microphone 150 ms later through a small
room, 6 dB down. Without the server's echo canceller the agent hears itself
and cuts its own reply short (a false barge-in); with it, the reply plays to
the end, and the caller can still interrupt.
"""

from __future__ import annotations

import asyncio
import functools
import re
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests import conftest
from tests.conftest import ServerFactory
from voice_agent.audio.echo import EchoCanceller
from voice_agent.audio.echo_presence import EchoPresence
from voice_agent.client import RealtimeClient, SimulatedEcho
from voice_agent.engine import Engine
from voice_agent.testing.audio_data import goforward, librivox, reference, silence, word_error_rate
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    chat_text,
    close_quietly,
    engine_with_llm,
    make_llm,
)

pytestmark = pytest.mark.e2e

RATE = 16_000


async def speakerphone_call(
    server_factory: ServerFactory, http: aiohttp.ClientSession, codec: str, **settings: Any
) -> tuple[Any, RealtimeClient]:
    server = await server_factory(**settings)
    client = RealtimeClient(server.url, codec=codec, echo=SimulatedEcho(150, -6))
    await client.connect(http)
    await asyncio.wait_for(client.wait_for_type("session.created"), 5)
    return server, client


async def ask(client: RealtimeClient, clip: str) -> tuple[float, asyncio.Future[dict[str, Any]]]:
    """Ask one question: when it was sent, and its reply's response.done."""
    done = client.wait_for_type("response.done", after=len(client.events))
    sent = await client.mic.play(np.concatenate((librivox(clip), silence(0.3))), RATE)
    return sent, done


@dataclass
class Reply:
    """The events of one reply to come: its audio starting, its response.done."""

    playing: asyncio.Future[dict[str, Any]]
    done: asyncio.Future[dict[str, Any]]


async def next_reply(client: RealtimeClient, clip: str) -> Reply:
    """Ask one question and return its reply's events (the first reply to
    start playing after it was asked)."""
    mark = len(client.events)
    playing = client.wait_for_type("output_audio_buffer.started", after=mark)

    def its_done(event: dict[str, Any]) -> bool:
        if event.get("type") != "response.done" or not playing.done() or playing.cancelled():
            return False
        return bool(event["response"]["id"] == playing.result()["response_id"])

    done = client.wait_for(its_done, after=mark)
    await client.mic.play(np.concatenate((librivox(clip), silence(0.3))), RATE)
    return Reply(playing, done)


def turns_started_after(client: RealtimeClient, t: float) -> int:
    return sum(
        1
        for event, at in zip(client.events, client.event_times, strict=True)
        if event["type"] == "input_audio_buffer.speech_started" and at > t
    )


async def test_without_echo_cancellation_a_speakerphone_cuts_the_reply_short(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    # The baseline the canceller exists for: the agent's own voice, coming
    # back, is taken for the caller speaking.
    server, client = await speakerphone_call(server_factory, http, "audio/PCMU", echo_cancel="off")
    sent, done = await ask(client, "0930")
    response = (await asyncio.wait_for(done, 40))["response"]
    assert response["status"] == "cancelled"
    assert response["status_details"]["reason"] == "turn_detected"
    assert turns_started_after(client, sent) >= 1
    (call,) = server.calls.calls()
    assert call.echo is None
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


@pytest.mark.slow
async def test_the_echo_canceller_lets_a_reply_play_out_on_a_speakerphone(
    server_factory: ServerFactory, http: aiohttp.ClientSession
) -> None:
    server, client = await speakerphone_call(server_factory, http, "audio/PCMU")  # auto
    sent, done = await ask(client, "0930")
    response = (await asyncio.wait_for(done, 40))["response"]
    assert response["status"] == "completed"
    first_sound = client.received.first_sound_after(sent)
    assert first_sound is not None
    await asyncio.sleep(1.5)  # the echo of the reply's last words comes back
    assert turns_started_after(client, sent) == 0
    async with http.get(client.call_url) as reply:
        echo = (await reply.json())["echo_cancel"]
    assert echo["playing_chunks"] > 50  # about a second of the reply, at least
    assert echo["echo_detected"] is True
    assert echo["removed_db"] >= 20.0, echo
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


# The reply the caller talks over: 105 words in 22 short sentences, far
# longer than the 2 s the test waits and the 3 s the caller then talks, so
# it is always still playing when they do, whatever the test's timing. The
# small embedded LLM sometimes told a story of a few seconds and ended first
# (CI failed so on a handset, six replies in a row).
STORY = (
    "Once there was a lighthouse on a rock. A keeper lived in it. He had a cat. "
    "Every night he lit the lamp. Every morning he put it out. Ships passed by. "
    "Some were big. Some were small. One night a storm came. The wind was loud. "
    "The waves were high. The lamp went dark. The keeper climbed the stairs. "
    "He found a match. He lit the lamp again. A ship saw the light. It turned away "
    "from the rocks. The sailors were safe. In the morning they came to thank him. "
    "They brought bread and fish. The cat ate the fish. The keeper laughed."
)


async def caller_words(client: RealtimeClient, mark: int) -> str:
    """Every user turn's transcript from event ``mark`` on, in order, once
    the caller has stopped speaking (call it after the clip has been sent).
    The canceller's double-talk suppression can leave a gap in the
    caller's first half second as long as the turn's silence, so one clip
    may come as two turns (a fragment of the overlap, then the rest)."""
    started = [
        e["item_id"]
        for e in client.events[mark:]
        if e["type"] == "input_audio_buffer.speech_started"
    ]
    assert started, "no user turn"
    heard = []
    for item_id in started:
        # Each speech that started stops (the turn's silence after the
        # clip), and its words come as that item's transcript, or it was
        # heard as no words (a fragment of the overlap may be).
        done = client.wait_for(functools.partial(is_transcript_of, item_id), after=mark)
        try:
            event = await asyncio.wait_for(done, 20)
        except TimeoutError:
            raise AssertionError(f"no transcript for the turn {item_id} in 20 s") from None
        heard.append(event.get("transcript", ""))
    return " ".join(text for text in heard if text)


def is_transcript_of(item_id: str, event: dict[str, Any]) -> bool:
    return bool(
        event["type"]
        in (
            "conversation.item.input_audio_transcription.completed",
            "conversation.item.input_audio_transcription.failed",
        )
        and event["item_id"] == item_id
    )


@pytest.mark.parametrize("speakerphone", [True, False])
@pytest.mark.slow
async def test_the_caller_can_still_interrupt(
    engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession, speakerphone: bool
) -> None:
    # On a speakerphone the caller talks over the echo of the reply; on a
    # handset there is no echo, and the canceller must notice and get out
    # of the way (AEC3 alone would hide the caller for its first seconds).
    # The LLM is a scripted peer that streams the long story word by word.
    words = [word + " " for word in STORY.split()]
    peer.script_for = lambda _body: Script(chat_text(*words), interval_s=0.02)
    llm = make_llm("chat-completions", peer.base_url)
    scripted = engine_with_llm(engine, llm, llm_prefill=False)
    echo = SimulatedEcho(150, -6) if speakerphone else None
    # G.711: echo_cancel auto is on.
    async with conftest.run_server(conftest.test_settings(), scripted) as server:
        client = RealtimeClient(server.url, codec="audio/PCMU", echo=echo)
        await client.connect(http)
        await asyncio.wait_for(client.wait_for_type("session.created"), 5)
        reply = await next_reply(client, "0930")
        await asyncio.wait_for(reply.playing, 30)
        # Into the reply, and its echo; on the handset, past the canceller's
        # judgement that there is none (about 1.4 s of the agent's speech).
        await asyncio.sleep(2.0)
        # Not cut short by its own echo.
        assert not reply.done.done(), reply.done.result()
        mark = len(client.events)
        started = client.wait_for_type("input_audio_buffer.speech_started", after=mark)
        said = client.mic.play(np.concatenate((librivox("0880"), silence(0.3))), RATE)
        detected = await asyncio.wait_for(started, 5)
        # Detected while the caller is still speaking (the clip is 3 s), not
        # only after the reply is over: before the clip's last frame left the
        # microphone, however slowly this host sent it.
        speech_ended = await said - 0.3  # (then 0.3 s of silence)
        assert client.event_times[client.events.index(detected)] < speech_ended
        response = (await asyncio.wait_for(reply.done, 20))["response"]
        assert response["status"] == "cancelled", response
        assert response["status_details"]["reason"] == "turn_detected"
        heard = await caller_words(client, mark)
        async with http.get(client.call_url) as status:
            assert (await status.json())["echo_cancel"]["echo_detected"] is speakerphone
        if speakerphone:
            # Its first half second overlaps the reply and its echo, and the
            # canceller's double-talk suppression costs words there ("he was
            # not an ill" heard as "and he'll" in 2 of 8 runs, "ill disposed"
            # as "old supposed" in 2). The words after the overlap must come
            # through (Whisper hears "young men" for them in about 1 of 4).
            assert re.search(r"\byoung m[ae]n\b", heard.lower()), heard
        else:
            assert word_error_rate(reference("0880"), heard) <= 0.25, heard
        await client.hangup(http)
        await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    await close_quietly(llm)


@pytest.mark.parametrize(
    ("codec", "setting", "cancels"),
    [
        ("audio/opus", "auto", False),  # a browser cancels its own echo
        ("audio/opus", "on", True),
        ("audio/PCMA", "auto", True),
        ("audio/PCMA", "off", False),
    ],
)
async def test_which_calls_get_the_echo_canceller(
    server_factory: ServerFactory,
    http: aiohttp.ClientSession,
    codec: str,
    setting: str,
    cancels: bool,
) -> None:
    server = await server_factory(echo_cancel=setting)
    client = RealtimeClient(server.url, codec=codec)
    await client.connect(http)
    (call,) = server.calls.calls()
    assert (call.echo is not None) is cancels
    await client.hangup(http)
    await asyncio.wait_for(server.calls.wait_for_count(0), 5)


def run_canceller(
    far: np.ndarray,
    near: np.ndarray,
    bursts: list[int],
    first_late_frames: int = 0,
    lost: set[int] | None = None,
    may_return: dict[int, bool] | None = None,
) -> tuple[np.ndarray, EchoCanceller]:
    """Feed a canceller the way a call does: each far-end frame as it
    leaves, the near end 80 ms behind it with its stream positions, in
    bursts of a few 20 ms frames (inbound jitter). ``first_late_frames``:
    the caller's first packet comes that many frames later than the rest
    would; ``lost``: near-end frames (indexes) that never arrive;
    ``may_return`` gets, for each near-end frame, what the canceller said
    of its own echo after it. Returns the cleaned audio, zeros where
    frames were lost."""
    far_48k = np.repeat(far, 3)  # the canceller decimates what it is told was played
    sent = {"position": 0}
    canceller = EchoCanceller(lambda: sent["position"] // 3)
    out = np.zeros(len(near), dtype=np.int16)
    waiting: list[int] = []  # near-end frames arrived but not yet released
    burst = iter(bursts)
    release_after = next(burst, 1)
    for frame in range(len(far) // 320):
        canceller.played(far_48k[frame * 960 : (frame + 1) * 960], frame * 960)
        sent["position"] = (frame + 1) * 960
        arrived = frame - 4
        if arrived < 0 or (arrived == 0 and first_late_frames):
            continue
        if first_late_frames and arrived == first_late_frames:
            waiting.append(0)  # the first packet, late
        if arrived not in (lost or set()):
            waiting.append(arrived)
        if len(waiting) >= release_after:
            for index in sorted(set(waiting)):
                at = index * 320
                cleaned = canceller.process(near[at : at + 320], at)
                out[at : at + len(cleaned)] = cleaned
                if may_return is not None:
                    may_return[index] = canceller.echo_may_return
            waiting, release_after = [], next(burst, 1)
    return out, canceller


def room_echo(far: np.ndarray, delay: int) -> np.ndarray:
    """What a speakerphone sends back of ``far``: ``delay`` samples later,
    6 dB down, through a direct path and three reflections within 40 ms."""
    room = np.zeros(640)
    room[[0, 112, 304, 528]] = [1.0, 0.45, -0.25, 0.12]
    return np.concatenate((np.zeros(delay), np.convolve(far, room)[: len(far) - delay])) * 0.5


def envelope(samples: np.ndarray) -> np.ndarray:
    frames = samples[: len(samples) // 160 * 160].astype(np.float64).reshape(-1, 160)
    return np.asarray(10 * np.log10(np.mean(frames**2, axis=1) + 1.0))


def level_db(samples: np.ndarray) -> float:
    return float(10 * np.log10(np.mean(samples.astype(np.float64) ** 2) + 1.0))


@pytest.mark.parametrize(
    ("first_late_frames", "loss"),
    [
        (0, 0.0),
        (5, 0.0),  # the caller's first packet 100 ms late: the near end gains on the far
        (0, 0.02),  # 2 % of the caller's packets lost
    ],
)
def test_recorded_speech_echo_is_removed_and_the_callers_voice_kept(
    first_late_frames: int, loss: float
) -> None:
    far = np.concatenate((librivox("0870"), librivox("0880"))).astype(np.float64)
    delay = int(0.2 * RATE)
    echo = room_echo(far, delay)
    caller = np.zeros(len(far))
    words = goforward().astype(np.float64)
    at = 6 * RATE
    caller[at : at + len(words)] = words
    rng = np.random.default_rng(0)
    near = np.clip(echo + caller + rng.normal(0, 30, len(far)), -32768, 32767).astype(np.int16)
    frames = len(near) // 320
    lost = {int(i) for i in rng.choice(frames, int(frames * loss), replace=False) if i > 0}
    out, canceller = run_canceller(
        far.astype(np.int16), near, [1, 3, 1, 2] * 400, first_late_frames, lost
    )
    assert canceller.presence.echo is True
    if first_late_frames:
        assert canceller.stats.realigned >= 1
    if lost:
        assert canceller.stats.bridged_chunks == 2 * len(lost)
    # Only audio that arrived is compared.
    kept = np.ones(len(near), dtype=bool)
    for index in lost:
        kept[index * 320 : (index + 1) * 320] = False
    # Echo alone (after the first second), before the caller speaks.
    echo_only = np.arange(RATE, at)[kept[RATE:at]]
    assert level_db(near[echo_only]) - level_db(out[echo_only]) >= 20.0
    # Double talk: the caller's words survive, within a few dB, and what
    # is left follows the caller's voice, not the echo's.
    talk = slice(at, at + len(words))
    assert level_db(out[talk]) >= level_db(caller[talk]) - 6.0
    assert np.corrcoef(envelope(out[talk]), envelope(caller[talk]))[0, 1] >= 0.6
    assert np.corrcoef(envelope(echo[talk]), envelope(caller[talk]))[0, 1] < 0.3


def test_a_line_without_echo_is_passed_through_even_when_the_caller_talks_over_the_agent() -> None:
    # AEC3 alone hides the near end for its first seconds (11-14 dB, in
    # case it is echo): a handset caller talking over the first reply would
    # go unheard. With no echo coming back (line noise only, while the
    # caller listens for the agent's first 1.6 s), the caller's audio
    # passes as is, also once they talk over the agent.
    far = np.concatenate((librivox("0870"), librivox("0890"), librivox("0920")))
    rng = np.random.default_rng(1)
    line = rng.normal(0, 30, len(far))
    words = librivox("0880")
    at = int(1.6 * RATE)
    caller = line.copy()
    caller[at : at + len(words)] += words[: len(far) - at]
    near = np.clip(caller, -32768, 32767).astype(np.int16)
    out, canceller = run_canceller(far, near, [1, 3, 1, 2] * 600)
    assert canceller.presence.echo is False
    assert canceller.stats.echo_detected is False
    talk = slice(at, at + len(words))
    np.testing.assert_array_equal(out[talk], near[talk])


def test_a_speakerphone_caller_talking_over_the_greeting_is_still_found_to_have_echo() -> None:
    # Double talk before any judgement ("hello?" over the agent's first
    # words) must not pass for a line without echo.
    far = np.concatenate((librivox("0870"), librivox("0890"))).astype(np.float64)
    delay = int(0.15 * RATE)
    echo = room_echo(far, delay)
    hello = goforward().astype(np.float64)
    caller = np.zeros(len(far))
    caller[int(0.3 * RATE) : int(0.3 * RATE) + len(hello)] = hello
    near = np.clip(echo + caller, -32768, 32767).astype(np.int16)
    out, canceller = run_canceller(far.astype(np.int16), near, [1, 3, 1, 2] * 400)
    assert canceller.presence.echo is True
    after = slice(int(4.0 * RATE), len(far))
    assert level_db(near[after]) - level_db(out[after]) >= 20.0


@pytest.mark.parametrize(("talks_at_s", "heard_for_s"), [(2.0, 1.0), (2.5, 0.6), (3.0, 1.0)])
def test_a_caller_barging_in_on_a_clean_line_is_not_taken_for_echo(
    talks_at_s: float, heard_for_s: float
) -> None:
    # A handset sends digital silence until the caller talks over the
    # agent, who stops ``heard_for_s`` later. That step up in the near
    # end's level once passed for echo (CI: echo_detected after a barge-in
    # on a handset); the syllables of the two voices do not match.
    agent = np.concatenate([librivox(clip) for clip in ("0930", "0890", "0920")])
    words = librivox("0880")
    at, cut = int(talks_at_s * RATE), int((talks_at_s + heard_for_s) * RATE)
    far = np.zeros(at + len(words) + 2 * RATE, dtype=np.int16)
    far[:cut] = agent[:cut]
    near = np.zeros(len(far), dtype=np.int16)
    near[at : at + len(words)] = words
    presence = EchoPresence()
    chunk = RATE // 100
    for start in range(0, len(far) - chunk + 1, chunk):
        presence.push(far[start : start + chunk], near[start : start + chunk])
        assert presence.echo is not True, start / RATE
    assert presence.echo is False


def test_once_the_agent_has_stopped_and_its_echo_died_away_the_caller_passes_untouched() -> None:
    # A speakerphone caller cuts the agent off. AEC3's suppression is slow
    # to let go after the far end stops, and cost the caller's words that
    # came after the overlap; once nothing has been played for longer than
    # the echo takes to come back, there is no echo left to remove.
    speech = np.concatenate((librivox("0870"), librivox("0890"))).astype(np.float64)
    stop = 5 * RATE
    far = np.zeros(stop + 4 * RATE)
    far[:stop] = speech[:stop]
    delay = int(0.2 * RATE)
    echo = room_echo(far, delay)
    words = librivox("0880").astype(np.float64)
    at = stop - RATE // 2  # the caller starts half a second before the agent stops
    caller = np.zeros(len(far))
    caller[at : at + len(words)] = words
    near = np.clip(echo + caller, -32768, 32767).astype(np.int16)
    out, canceller = run_canceller(far.astype(np.int16), near, [1, 3, 1, 2] * 600)
    assert canceller.presence.echo is True
    # The echo alone, before the caller spoke, is still removed.
    assert level_db(near[2 * RATE : at]) - level_db(out[2 * RATE : at]) >= 20.0
    # The echo is back within its delay and dies away in the room's 40 ms:
    # from then on (the delay found, plus the 200 ms allowed for the tail),
    # the caller's words are passed as they came.
    lag_s = canceller.presence.echo_delay_chunks / 100
    untouched = stop + int((lag_s + 0.22) * RATE)
    assert untouched < at + len(words) - RATE
    after = slice(untouched, at + len(words))
    np.testing.assert_array_equal(out[after], near[after])


def test_a_word_played_while_the_caller_sent_nothing_is_still_cancelled() -> None:
    # A phone sends nothing while its user is quiet (DTX). If the agent says
    # one short word in such a gap, its echo comes back in the first packets
    # after it, and must still be cancelled, not passed as the caller.
    speech = librivox("0870").astype(np.float64)
    far = np.zeros(9 * RATE)
    far[: 4 * RATE] = speech[: 4 * RATE]
    word = slice(6 * RATE, 6 * RATE + 4 * RATE // 10)  # 0.4 s of speech
    far[word] = speech[4 * RATE : 4 * RATE + 4 * RATE // 10]
    delay = int(0.2 * RATE)
    echo = room_echo(far, delay)
    near = np.clip(echo, -32768, 32767).astype(np.int16)
    # Nothing from the caller from 5.5 s until just after the word ends.
    gap = set(range(int(5.5 * RATE) // 320, word.stop // 320 + 1))
    out, canceller = run_canceller(far.astype(np.int16), near, [1, 3, 1, 2] * 600, lost=gap)
    assert canceller.presence.echo is True
    assert canceller.stats.bridged_chunks == 2 * len(gap)
    heard_back = slice((word.stop // 320 + 1) * 320, word.stop + delay + RATE // 10)
    assert level_db(near[heard_back]) > 50.0
    assert level_db(near[heard_back]) - level_db(out[heard_back]) >= 15.0


def test_the_agents_own_echo_may_be_heard_until_its_delay_after_it_stops() -> None:
    # What the barge-in rule is told (session/barge_in.py): on a line that
    # echoes, a burst heard while the agent plays, or within its echo's
    # delay (plus 100 ms) after it stopped, may be nothing but that echo.
    speech = librivox("0870").astype(np.float64)
    stop = 5 * RATE
    far = np.zeros(stop + 2 * RATE)
    far[:stop] = speech[:stop]
    delay = int(0.2 * RATE)
    near = np.clip(room_echo(far, delay), -32768, 32767).astype(np.int16)
    frames: dict[int, bool] = {}
    run_canceller(far.astype(np.int16), near, [1, 3, 1, 2] * 600, may_return=frames)
    frame_at = {index: index * 320 for index in frames}
    playing = [i for i, at in frame_at.items() if RATE <= at < stop + delay - 320]
    assert playing and all(frames[i] for i in playing)
    # The delay as found (within a frame), 100 ms of tail, then no echo.
    over = [i for i, at in frame_at.items() if at >= stop + delay + int(0.14 * RATE)]
    assert over and not any(frames[i] for i in over)
    assert frames[(stop + delay + int(0.06 * RATE)) // 320]  # within the tail


def test_on_a_line_found_without_echo_no_audio_is_taken_for_its_echo() -> None:
    speech = librivox("0870").astype(np.float64)
    far = speech[: 6 * RATE]
    line = np.random.default_rng(1).normal(0, 30, len(far))
    near = np.clip(line, -32768, 32767).astype(np.int16)
    frames: dict[int, bool] = {}
    _, canceller = run_canceller(far.astype(np.int16), near, [1, 3, 1, 2] * 600, may_return=frames)
    assert canceller.presence.echo is False
    last_second = [i for i in frames if i * 320 >= 5 * RATE - 640]
    assert last_second and not any(frames[i] for i in last_second)
