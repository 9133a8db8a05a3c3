"""The LLM prefill of the user's words so far (``--llm-prefill-partials``):
while a caller speaks, each partial transcript's words are sent ahead as a
one-token request with the conversation they will be part of; the reply's
own request cancels one still in flight; a process-wide gate sheds them
under load; and llama-server really reuses what they cached."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import pytest_asyncio

from tests.conftest import run_server
from tests.conftest import test_settings as settings_with
from tests.stt_fixtures import engine_with_models, parakeet_settings
from tests.test_llama_slots import complete
from voice_agent.backends.base import ChatMessage, SttBackend, ToolCall
from voice_agent.backends.llm.chat_completions import OpenAIChatLlm, chat_message
from voice_agent.client import RealtimeClient
from voice_agent.engine import Engine
from voice_agent.session.conversation import Conversation
from voice_agent.session.prefill import PrefillGate, RepliesWatched, SessionPrefills
from voice_agent.testing.audio_data import librivox, silence
from voice_agent.testing.scripted_llm import (
    Json,
    Script,
    ScriptedLlmServer,
    chat_text,
    close_quietly,
    make_llm,
    scripted_llm_server,
)
from voice_agent.testing.tiny_nemo import phrase_audio

pytestmark = pytest.mark.e2e

TRANSCRIPT_DONE = "conversation.item.input_audio_transcription.completed"


def is_words_prefill(body: Json) -> bool:
    """A prefill (one token) whose user message holds words: not the history's."""
    return body.get("max_tokens") == 1 and bool(user_words(body))


def user_words(body: Json) -> str:
    last = body["messages"][-1]
    return str(last["content"]) if last["role"] == "user" else ""


def system_of(body: Json) -> str:
    first = body["messages"][0]
    return str(first["content"]) if first["role"] == "system" else ""


def answer_prefills_and_replies(body: Json) -> Script:
    return Script(chat_text("Okay."))


def hang_word_prefills(body: Json) -> Script:
    """Words prefills never answer (only the reply's request ends them)."""
    if is_words_prefill(body):
        return Script(hang_before=True)
    return Script(chat_text("Okay."))


@pytest_asyncio.fixture
async def peer() -> AsyncIterator[ScriptedLlmServer]:
    async with scripted_llm_server() as server:
        yield server


async def requests_arrived(peer: ScriptedLlmServer, count: int) -> None:
    while len(peer.requests) < count:
        peer.arrived.clear()
        await asyncio.wait_for(peer.arrived.wait(), 5)


async def speak(
    client: RealtimeClient, instructions: str, audio: np.ndarray
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Set the call's instructions (so its requests can be told from the
    others'), say ``audio``; the final transcript and the reply's done."""
    client.send({"type": "session.update", "session": {"instructions": instructions}})
    await asyncio.wait_for(client.wait_for_type("session.updated"), 5)
    transcript = client.wait_for_type(TRANSCRIPT_DONE)
    done = client.wait_for_type("response.done")
    await client.mic.play(np.concatenate((silence(0.3), audio, silence(1.0))), 16000)
    return await asyncio.wait_for(transcript, 60), await asyncio.wait_for(done, 30)


async def test_three_callers_each_prefill_their_own_words_before_their_reply(
    engine: Engine,
    parakeet: SttBackend,
    tiny_nemo_model: Path,
    peer: ScriptedLlmServer,
    http: aiohttp.ClientSession,
) -> None:
    peer.script_for = answer_prefills_and_replies
    llm = make_llm("chat-completions", peer.base_url)
    settings = parakeet_settings(tiny_nemo_model, max_calls=4)
    served = engine_with_models(engine, settings, stt=parakeet, llm=llm)
    assert served.session_config().prefill_partials  # on by default with prefill
    served.prefill_gate = PrefillGate(limit=3)  # this test is about content, not shedding
    phrases = ["goforward", "0880", "goforward"]
    try:
        async with run_server(settings, served) as server:
            clients = [RealtimeClient(server.url) for _ in phrases]
            for client in clients:
                await client.connect(http)
            results = await asyncio.gather(
                *(
                    speak(client, f"You are assistant number {i}.", phrase_audio(name))
                    for i, (client, name) in enumerate(zip(clients, phrases, strict=True))
                )
            )
            for client in clients:
                await client.hangup(http)
    finally:
        await close_quietly(llm)
    bodies = peer.bodies()
    for i, (transcript, done) in enumerate(results):
        final = transcript["transcript"]
        assert final and done["response"]["status"] == "completed"
        mine = [
            (n, b) for n, b in enumerate(bodies) if system_of(b) == f"You are assistant number {i}."
        ]
        replies = [(n, b) for n, b in mine if b.get("max_tokens") != 1]
        prefills = [(n, b) for n, b in mine if is_words_prefill(b)]
        assert replies and prefills, f"call {i}: {len(replies)} replies, {len(prefills)} prefills"
        reply_at, reply = replies[-1]
        assert user_words(reply) == final
        # Sent before the reply, with the reply's conversation up to the
        # user's words, and with words the final transcript starts with:
        # the reply's prompt extends the prefill's up to them.
        assert any(n < reply_at for n, _ in prefills)
        for _, prefill in prefills:
            assert prefill["messages"][:-1] == reply["messages"][:-1]
        assert any(final.startswith(user_words(p)) for _, p in prefills), (
            final,
            [user_words(p) for _, p in prefills],
        )
    assert served.prefill_gate.in_flight == 0


async def test_whisper_partials_when_asked_for_prefill_the_words_whisper_heard(
    engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    """faster-whisper (the shared engine's) gives partials only when
    --stt-partial-interval-ms asks: its words so far are prefilled."""
    peer.script_for = answer_prefills_and_replies
    llm = make_llm("chat-completions", peer.base_url)
    assert engine.models is not None
    assert engine_with_models(engine, settings_with()).session_config().partial_interval_ms == 0
    settings = settings_with(stt_partial_interval_ms=700)
    served = engine_with_models(engine, settings, llm=llm)
    try:
        async with run_server(settings, served) as server:
            client = RealtimeClient(server.url)
            await client.connect(http)
            transcript, done = await speak(client, "Be brief.", librivox("0880"))
            await client.hangup(http)
    finally:
        await close_quietly(llm)
    final = transcript["transcript"]
    bodies = peer.bodies()
    replies = [(n, b) for n, b in enumerate(bodies) if b.get("max_tokens") != 1]
    prefills = [(n, b) for n, b in enumerate(bodies) if is_words_prefill(b)]
    assert done["response"]["status"] == "completed" and replies and prefills
    reply_at, reply = replies[-1]
    assert user_words(reply) == final
    assert any(n < reply_at for n, _ in prefills)
    for _, prefill in prefills:
        assert prefill["messages"][:-1] == reply["messages"][:-1]
    # The words Whisper heard of this turn: a partial of less audio (or the
    # final, drafted from one) may settle a close call differently further
    # on (0880's "ill-disposed" as "ill-sposed" or "old-sposed"), so the
    # opening words are compared.
    prefilled = [user_words(p) for _, p in prefills]
    assert any(opening(words) == opening(final) for words in prefilled), (final, prefilled)


def opening(text: str, count: int = 3) -> list[str]:
    """The first ``count`` words, lower case, without punctuation."""
    return "".join(c for c in text.lower() if c.isalnum() or c.isspace()).split()[:count]


async def test_the_reply_cancels_a_prefill_still_in_flight(
    engine: Engine,
    parakeet: SttBackend,
    tiny_nemo_model: Path,
    peer: ScriptedLlmServer,
    http: aiohttp.ClientSession,
) -> None:
    peer.script_for = hang_word_prefills
    # Longer than the turn: a prefill that hangs is not retried meanwhile.
    llm = make_llm("chat-completions", peer.base_url, first_token_timeout_s=30.0)
    settings = parakeet_settings(tiny_nemo_model)
    served = engine_with_models(engine, settings, stt=parakeet, llm=llm)
    try:
        async with run_server(settings, served) as server:
            client = RealtimeClient(server.url)
            await client.connect(http)
            _, done = await speak(client, "Be brief.", phrase_audio("0880"))
            assert done["response"]["status"] == "completed"
            bodies = peer.bodies()
            prefills = [b for b in bodies if is_words_prefill(b)]
            # While one hangs, later partials are not prefilled (never queued).
            assert prefills and served.prefill_gate.sent == len(prefills)
            # Each was cut off by the reply's own request, which was answered.
            await asyncio.wait_for(peer.wait_for_disconnects(len(prefills)), 5)
            assert served.prefill_gate.in_flight == 0
            await client.hangup(http)
    finally:
        await close_quietly(llm)


async def test_the_gate_sheds_words_prefills_beyond_its_limit(peer: ScriptedLlmServer) -> None:
    peer.script_for = hang_word_prefills
    llm = make_llm("chat-completions", peer.base_url)
    gate = PrefillGate(limit=2)
    sessions = [SessionPrefills(llm, f"sess_{i}", gate) for i in range(3)]

    def prompt(i: int, words: str) -> list[ChatMessage]:
        return [ChatMessage("system", f"Assistant {i}."), ChatMessage("user", words)]

    try:
        sent = [s.words("go forward", prompt(i, "go forward"), ()) for i, s in enumerate(sessions)]
        assert sent == [True, True, False] and gate.shed == 1
        await requests_arrived(peer, 2)
        assert [system_of(b) for b in peer.bodies()] == ["Assistant 0.", "Assistant 1."]
        # A session's own prefill in flight: its next words wait for the next partial.
        assert not sessions[0].words("go forward ten", prompt(0, "go forward ten"), ())
        # The reply of session 0 starts: its prefill is cut off, the gate has room.
        sessions[0].cancel()
        await asyncio.wait_for(peer.wait_for_disconnects(1), 5)
        assert gate.in_flight == 1
        assert sessions[2].words("go forward ten", prompt(2, "go forward ten"), ())
        await requests_arrived(peer, 3)
        assert system_of(peer.bodies()[2]) == "Assistant 2."
        for session in sessions:
            await session.aclose()
        assert gate.in_flight == 0 and gate.sent == 3
    finally:
        await close_quietly(llm)


async def test_no_words_prefill_starts_while_a_reply_waits_for_its_first_token(
    peer: ScriptedLlmServer,
) -> None:
    def script(body: Json) -> Script:
        if is_words_prefill(body):
            return Script(chat_text("x"))
        if user_words(body) == "silent":  # a reply whose first token never comes
            return Script(hang_before=True)
        return Script(chat_text("Sure", " thing."), hang_after=2)  # first token, then hangs

    peer.script_for = script
    llm = make_llm("chat-completions", peer.base_url, first_token_timeout_s=30.0)
    gate = PrefillGate(limit=2)
    replies = RepliesWatched(llm, gate)
    prefills = SessionPrefills(llm, "sess_1", gate)
    words = [ChatMessage("user", "go forward")]

    async def first_output(text: str) -> str | ToolCall:
        stream = replies.stream_reply([ChatMessage("user", text)], 60, 0.5)
        return await anext(stream)

    try:
        waiting = asyncio.create_task(first_output("silent"))
        await requests_arrived(peer, 1)
        assert gate.replies_waiting == 1
        assert not prefills.words("go forward", words, ()) and gate.shed == 1
        waiting.cancel()  # the reply is cancelled (barge-in): it waits no more
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        assert gate.replies_waiting == 0
        # A reply that has had its first token no longer holds prefills back.
        stream = replies.stream_reply([ChatMessage("user", "hello")], 60, 0.5)
        assert await anext(stream) == "Sure"
        assert gate.replies_waiting == 0
        assert prefills.words("go forward", words, ())
        await stream.aclose()  # type: ignore[attr-defined]
        await prefills.aclose()
        assert gate.in_flight == 0 and gate.sent == 1
    finally:
        await close_quietly(llm)


async def test_llama_server_reuses_the_words_prefill_for_the_reply(
    engine: Engine, http: aiohttp.ClientSession
) -> None:
    """The prefill's prompt ends with the template's end-of-message tokens,
    the reply's with more words: llama.cpp still reuses all they share."""
    assert engine.llama is not None and isinstance(
        engine.models and engine.models.llm, OpenAIChatLlm
    )
    assert engine.models is not None
    llm = engine.models.llm
    turn = "Could you suggest something quick for dinner tonight using chicken and rice"
    processed: dict[str, int] = {}
    for kind in ("history", "words"):
        conversation = Conversation(f"You are a cook ({kind}). Answer briefly.", 4)
        conversation.add_user(f"Hello, I have a question about cooking ({kind}).")
        conversation.add(ChatMessage("assistant", "Sure, ask away."))
        so_far = "" if kind == "history" else " ".join(turn.split()[:-3])
        await llm.prefill(conversation.messages_for(so_far))
        messages = [chat_message(m) for m in conversation.messages_for(turn)]
        reply = await complete(http, engine.llama.base_url, messages, 1)
        processed[kind] = reply["timings"]["prompt_n"]
    # The last three words and the closing tokens, against the whole turn.
    assert processed["words"] <= 12 < processed["history"], processed
