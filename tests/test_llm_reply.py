"""A reply through the real TTS, driven by a scripted LLM over HTTP: server
tool rounds, tool timeouts, the step limit, client tool calls, filtered
text, and the spoken apology when the LLM fails."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from voice_agent.backends.base import ChatMessage, ToolCall, ToolSpec
from voice_agent.engine import Engine
from voice_agent.session.conversation import Conversation
from voice_agent.session.events import (
    AssistantTextDelta,
    FunctionCallRequested,
    ResponseFinished,
    SessionError,
    SessionEvent,
)
from voice_agent.session.reply import OUTPUT_FRAME_SAMPLES, PieceTag, Reply, ReplySettings
from voice_agent.session.tools import ToolRegistry
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    call_events,
    chat_text,
    close_quietly,
    make_llm,
    text_events,
)

APIS = ["chat-completions", "responses"]
APOLOGY = "Sorry, I can't answer right now."


class Recorder:
    """An audio output that keeps what it is given (stands in for the track)."""

    def __init__(self) -> None:
        self.chunks: list[np.ndarray] = []

    async def write(self, samples: np.ndarray, tag: Any = None) -> None:
        self.chunks.append(samples)

    async def finish(self) -> None:
        return None

    async def drain(self) -> None:
        return None

    def flush(self) -> None:
        return None

    def pause(self) -> None:
        return None

    def resume(self) -> None:
        return None

    def peak(self) -> int:
        return max((int(np.abs(c).max()) for c in self.chunks if c.size), default=0)


async def reply(
    engine: Engine,
    api: str,
    peer: ScriptedLlmServer,
    tools: list[ToolSpec] | None = None,
    server_tools: ToolRegistry | None = None,
    max_tool_steps: int = 3,
) -> tuple[ResponseFinished, list[SessionEvent], Conversation, Recorder]:
    assert engine.models is not None
    llm = make_llm(api, peer.base_url, retries=1)
    events: list[SessionEvent] = []
    conversation = Conversation("Be brief.", 4)
    conversation.add_user("What's the weather in Paris?")
    output = Recorder()
    response = Reply(
        "resp_1",
        "item_1",
        conversation.messages_for(None),
        llm,
        engine.models.tts,
        output,
        conversation,
        events.append,
        ReplySettings(60, 0.5, max_tool_steps=max_tool_steps, apology=APOLOGY),
        tools=[*(server_tools.specs if server_tools else []), *(tools or [])],
        server_tools=server_tools,
    )
    try:
        response.start()
        response.commit()
        await response.wait_closed()
    finally:
        await close_quietly(llm)
    finished = [e for e in events if isinstance(e, ResponseFinished)]
    assert len(finished) == 1
    return finished[0], events, conversation, output


def spoken(events: list[SessionEvent]) -> str:
    return "".join(e.delta for e in events if isinstance(e, AssistantTextDelta))


@pytest.fixture
def tools() -> ToolRegistry:
    return ToolRegistry.from_module("tests.tools_example", timeout_s=0.5)


@pytest.mark.parametrize("api", APIS)
async def test_a_server_tool_result_is_fed_back_and_the_answer_spoken(
    engine: Engine, api: str, peer: ScriptedLlmServer, tools: ToolRegistry
) -> None:
    peer.add(
        Script(call_events(api, ("call_1", "get_weather", '{"city": "Paris"}'))),
        Script(text_events(api, "It is sunny ", "in Paris.")),
    )
    finished, events, conversation, output = await reply(engine, api, peer, server_tools=tools)
    assert finished.status == "completed"
    assert spoken(events) == "It is sunny in Paris."
    assert output.peak() > 1000
    second = str(peer.bodies()[1])
    assert "sunny in Paris, 24 degrees celsius" in second and "call_1" in second
    history = conversation.history
    assert history[1].tool_calls == (ToolCall("call_1", "get_weather", '{"city": "Paris"}'),)
    assert history[2] == ChatMessage(
        "tool", "sunny in Paris, 24 degrees celsius", tool_call_id="call_1"
    )
    assert history[3] == ChatMessage("assistant", "It is sunny in Paris.")


async def test_a_tool_that_times_out_tells_the_model(
    engine: Engine, peer: ScriptedLlmServer, tools: ToolRegistry
) -> None:
    api = "chat-completions"
    peer.add(
        Script(call_events(api, ("call_1", "slow_lookup", '{"query": "news"}'))),
        Script(text_events(api, "I could not look that up.")),
    )
    finished, events, _, _ = await reply(engine, api, peer, server_tools=tools)
    assert finished.status == "completed"
    tool_message = peer.bodies()[1]["messages"][-1]
    assert tool_message["role"] == "tool"
    assert tool_message["content"] == "error: slow_lookup did not finish within 0.5 s"
    assert spoken(events) == "I could not look that up."


@pytest.mark.parametrize("api", APIS)
async def test_tool_rounds_stop_at_the_step_limit(
    engine: Engine, api: str, peer: ScriptedLlmServer, tools: ToolRegistry
) -> None:
    call = ("call_1", "get_weather", '{"city": "Paris"}')
    again = ("call_2", "get_weather", '{"city": "Rome"}')
    peer.add(Script(call_events(api, call)), Script(call_events(api, again)))
    finished, events, conversation, _ = await reply(
        engine, api, peer, server_tools=tools, max_tool_steps=2
    )
    # The model ignored tool_choice "none" and said nothing: not a silent success.
    assert finished.status == "failed" and finished.reason == "tool_step_limit"
    assert [e.code for e in events if isinstance(e, SessionError)] == ["tool_step_limit"]
    assert spoken(events) == APOLOGY
    bodies = peer.bodies()
    assert len(bodies) == 2
    assert bodies[0]["tool_choice"] == "auto"
    assert bodies[1]["tool_choice"] == "none"  # the last round has to answer
    # The call made in the last round was never run.
    results = [m for m in conversation.history if m.role == "tool"]
    assert [m.tool_call_id for m in results] == ["call_1"]


@pytest.mark.parametrize("api", APIS)
async def test_a_client_tool_call_is_handed_to_the_client(
    engine: Engine, api: str, peer: ScriptedLlmServer
) -> None:
    lookup = ToolSpec("lookup_order", "Find an order.", {"type": "object", "properties": {}})
    peer.add(Script(call_events(api, ("call_9", "lookup_order", '{"id": 42}'))))
    finished, events, conversation, _ = await reply(engine, api, peer, tools=[lookup])
    assert finished.status == "completed"
    (requested,) = [e for e in events if isinstance(e, FunctionCallRequested)]
    assert (requested.call_id, requested.name, requested.arguments) == (
        "call_9",
        "lookup_order",
        '{"id": 42}',
    )
    assert len(peer.requests) == 1  # the client answers; no second round here
    assert conversation.history[-1].tool_calls[0].call_id == "call_9"


async def test_thinking_markdown_and_emoji_are_not_spoken(
    engine: Engine, peer: ScriptedLlmServer
) -> None:
    api = "chat-completions"
    peer.add(
        Script(
            text_events(api, "<think>The user wants", " weather.</think>", "**Sunny** 😀 today.")
        )
    )
    finished, events, conversation, _ = await reply(engine, api, peer)
    assert finished.status == "completed"
    assert spoken(events) == "Sunny today."
    assert finished.transcript == "Sunny today."
    assert conversation.history[-1].content == "**Sunny** 😀 today."


@pytest.mark.parametrize("api", APIS)
async def test_an_llm_failure_before_any_text_is_apologised_for(
    engine: Engine, api: str, peer: ScriptedLlmServer
) -> None:
    peer.add(Script(status=500), Script(status=500))
    finished, events, _, output = await reply(engine, api, peer)
    assert finished.status == "failed" and finished.reason == "http_500"
    (error,) = [e for e in events if isinstance(e, SessionError)]
    assert error.code == "http_500" and "answered 500" in error.message
    # The provider's words and its address stay in the log.
    assert "scripted failure" not in error.message and peer.url not in error.message
    assert spoken(events) == APOLOGY
    assert output.peak() > 1000  # the apology was synthesised and played


async def test_an_llm_failure_after_some_text_ends_the_reply_with_the_apology(
    engine: Engine, peer: ScriptedLlmServer
) -> None:
    """Cut off mid-sentence, unexplained, the caller would wait for the rest."""
    api = "chat-completions"
    events_ = text_events(api, "The weather in Paris is, ", "sunny.")
    peer.add(Script(events_, drop_after=2))
    finished, events, _, output = await reply(engine, api, peer)
    assert finished.status == "failed" and finished.reason == "stream_interrupted"
    assert [e.code for e in events if isinstance(e, SessionError)] == ["stream_interrupted"]
    assert spoken(events) == f"The weather in Paris is, {APOLOGY}"
    assert output.peak() > 1000


async def test_cancelling_a_reply_hangs_up_on_the_llm(
    engine: Engine, peer: ScriptedLlmServer
) -> None:
    """Barge-in or hang-up: the LLM server sees its client go away and can stop."""
    assert engine.models is not None
    api = "chat-completions"
    peer.add(Script(text_events(api, "Once upon a time, ", "there was"), hang_after=2))
    llm = make_llm(api, peer.base_url, read_timeout_s=30)
    events: list[SessionEvent] = []
    speaking = asyncio.Event()

    def emit(event: SessionEvent) -> None:
        events.append(event)
        if isinstance(event, AssistantTextDelta):
            speaking.set()

    response = Reply(
        "resp_1",
        "item_1",
        [ChatMessage("user", "A story, please.")],
        llm,
        engine.models.tts,
        Recorder(),
        Conversation("", 4),
        emit,
        ReplySettings(60, 0.5),
    )
    try:
        response.start()
        response.commit()
        await asyncio.wait_for(speaking.wait(), 10)  # the model is mid-reply
        assert peer.disconnects == 0
        response.cancel("turn_detected")
        await response.wait_closed()
        await asyncio.wait_for(peer.disconnected.wait(), 5)
    finally:
        await close_quietly(llm)
    (finished,) = [e for e in events if isinstance(e, ResponseFinished)]
    assert finished.status == "cancelled"


class BrokenOutput(Recorder):
    """An audio output whose writes fail (a track that broke mid-call)."""

    async def write(self, samples: np.ndarray, tag: Any = None) -> None:
        raise RuntimeError("the track is gone")


async def test_a_playback_failure_stops_generation_and_lets_the_reply_close(
    engine: Engine, peer: ScriptedLlmServer
) -> None:
    """The generator must not stay blocked on a queue nobody reads, holding the LLM stream."""
    assert engine.models is not None
    api = "chat-completions"
    sentences = [f"Sentence number {n} is here. " for n in range(8)]
    peer.add(Script(text_events(api, *sentences), hang_after=len(sentences)))
    llm = make_llm(api, peer.base_url, read_timeout_s=30)
    events: list[SessionEvent] = []
    closed: list[Reply] = []
    response = Reply(
        "resp_1",
        "item_1",
        [ChatMessage("user", "Talk, please.")],
        llm,
        engine.models.tts,
        BrokenOutput(),
        Conversation("", 4),
        events.append,
        ReplySettings(60, 0.5),
    )
    response.closed_callbacks.append(closed.append)
    try:
        response.start()
        response.commit()
        waiting = asyncio.ensure_future(response.wait_closed())
        done, _ = await asyncio.wait({waiting}, timeout=20)
        waiting.cancel()
        assert waiting in done, "the reply's tasks never stopped"
        await asyncio.wait_for(peer.disconnected.wait(), 5)  # the LLM stream was closed
    finally:
        await close_quietly(llm)
    (finished,) = [e for e in events if isinstance(e, ResponseFinished)]
    assert finished.status == "failed"
    assert closed == [response]
    response.cancel("session_closed")  # a no-op now, and never raises


class PlayingOutput(Recorder):
    """Counts every written frame as played at once, then holds the reply in
    ``drain`` (audio still playing) until it is cancelled: a barge-in window."""

    def __init__(self) -> None:
        super().__init__()
        self.response: Reply | None = None
        self.draining = asyncio.Event()

    async def write(self, samples: np.ndarray, tag: Any = None) -> None:
        await super().write(samples, tag)
        assert self.response is not None and isinstance(tag, PieceTag)
        for _ in range(-(-samples.size // OUTPUT_FRAME_SAMPLES)):
            self.response.frame_sent(tag)

    async def drain(self) -> None:
        self.draining.set()
        await asyncio.Event().wait()


async def barge_in_while_draining(
    engine: Engine,
    peer: ScriptedLlmServer,
    tools: list[ToolSpec],
    server_tools: ToolRegistry | None = None,
) -> tuple[list[SessionEvent], Conversation]:
    """A reply cut off by the user after every word was spoken, before its audio ended."""
    assert engine.models is not None
    llm = make_llm("chat-completions", peer.base_url, retries=1)
    events: list[SessionEvent] = []
    conversation = Conversation("", 4)
    conversation.add_user("Where is my order?")
    output = PlayingOutput()
    response = Reply(
        "resp_1",
        "item_1",
        conversation.messages_for(None),
        llm,
        engine.models.tts,
        output,
        conversation,
        events.append,
        ReplySettings(60, 0.5, apology=APOLOGY),
        tools=tools,
        server_tools=server_tools,
    )
    output.response = response
    try:
        response.start()
        response.commit()
        await asyncio.wait_for(output.draining.wait(), 20)
        response.cancel("turn_detected")
        await response.wait_closed()
    finally:
        await close_quietly(llm)
    return events, conversation


def words_then_call(words: str, call: tuple[str, str, str]) -> list[dict[str, Any]]:
    return chat_text(words)[:-1] + call_events("chat-completions", call)


async def test_a_barge_in_keeps_a_server_tool_round_that_ran(
    engine: Engine, peer: ScriptedLlmServer, tools: ToolRegistry
) -> None:
    """The model must learn that the tool ran; the cut-off round adds only its own words."""
    call = ("call_1", "get_weather", '{"city": "Paris"}')
    peer.add(
        Script(words_then_call("Let me look.", call)),
        Script(text_events("chat-completions", "It is sunny in Paris.")),
    )
    events, conversation = await barge_in_while_draining(engine, peer, tools.specs, tools)
    (finished,) = [e for e in events if isinstance(e, ResponseFinished)]
    assert finished.status == "cancelled"
    assert conversation.history == [
        ChatMessage("user", "Where is my order?"),
        ChatMessage("assistant", "Let me look.", tool_calls=(ToolCall(*call),)),
        ChatMessage("tool", "sunny in Paris, 24 degrees celsius", tool_call_id="call_1"),
        ChatMessage("assistant", "It is sunny in Paris."),
    ]


async def test_a_barge_in_before_a_client_call_is_handed_over_records_no_call(
    engine: Engine, peer: ScriptedLlmServer
) -> None:
    """Only the words heard, once: no call the client never got (it could never answer it)."""
    lookup = ToolSpec("lookup_order", "Find an order.", {"type": "object", "properties": {}})
    peer.add(Script(words_then_call("Let me check.", ("call_9", "lookup_order", "{}"))))
    events, conversation = await barge_in_while_draining(engine, peer, [lookup])
    assert not [e for e in events if isinstance(e, FunctionCallRequested)]
    assert conversation.history == [
        ChatMessage("user", "Where is my order?"),
        ChatMessage("assistant", "Let me check."),
    ]


@pytest.mark.parametrize("max_tool_steps", [1, 2])
async def test_words_before_the_step_limit_are_a_completed_reply(
    engine: Engine, peer: ScriptedLlmServer, tools: ToolRegistry, max_tool_steps: int
) -> None:
    api = "chat-completions"
    first = ("call_1", "get_weather", '{"city": "Paris"}')
    last = ("call_2", "get_weather", '{"city": "Rome"}')
    rounds = [Script(call_events(api, first))] if max_tool_steps == 2 else []
    peer.add(*rounds, Script(words_then_call("It is sunny in Paris.", last)))
    finished, events, _, _ = await reply(
        engine, api, peer, server_tools=tools, max_tool_steps=max_tool_steps
    )
    assert finished.status == "completed"
    assert spoken(events) == "It is sunny in Paris."
    assert len(peer.requests) == max_tool_steps


@pytest.mark.parametrize("api", APIS)
async def test_an_empty_reply_is_apologised_for(
    engine: Engine, api: str, peer: ScriptedLlmServer
) -> None:
    """No text and no call (or only hidden thinking): silence would leave the user waiting."""
    peer.add(Script(text_events(api, "<think>Hmm.</think>")))
    finished, events, _, _ = await reply(engine, api, peer)
    assert finished.status == "failed" and finished.reason == "empty_reply"
    assert spoken(events) == APOLOGY
