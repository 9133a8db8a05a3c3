"""Both LLM backends against a real HTTP peer speaking the OpenAI streaming
wire format: text, tool-call fragments, parallel calls, errors, hangs,
dropped connections and cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from voice_agent.backends.base import ChatMessage, LlmError, ToolCall, ToolSpec
from voice_agent.testing.ports import free_port
from voice_agent.testing.scripted_llm import (
    API_PATHS,
    Script,
    ScriptedLlmServer,
    call_events,
    chat_chunk,
    make_llm,
    text_events,
)

APIS = ["chat-completions", "responses"]
MESSAGES = [
    ChatMessage("system", "Be brief."),
    ChatMessage("user", "Hi"),
    ChatMessage("assistant", "Hello!"),
    ChatMessage("user", "Weather?"),
]
WEATHER = ToolSpec(
    "get_weather",
    "The weather in a city.",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)


async def collect(api: str, url: str, **config: Any) -> list[str | ToolCall]:
    llm = make_llm(api, url, **config)
    try:
        return [o async for o in llm.stream_reply(MESSAGES, 50, 0.5, [WEATHER])]
    finally:
        await llm.aclose()


@pytest.mark.parametrize("api", APIS)
async def test_text_streams_as_deltas_and_the_request_is_well_formed(
    api: str, peer: ScriptedLlmServer
) -> None:
    peer.add(Script(text_events(api, "Sunny ", "and ", "warm.")))
    outputs = await collect(api, peer.base_url)
    assert outputs == ["Sunny ", "and ", "warm."]
    ((path, body),) = peer.requests
    assert path == API_PATHS[api]
    assert body["model"] == "scripted-model" and body["stream"] is True
    if api == "chat-completions":
        assert [m["role"] for m in body["messages"]] == ["system", "user", "assistant", "user"]
        assert body["max_tokens"] == 50
        assert body["tools"][0]["function"]["name"] == "get_weather"
    else:
        assert body["instructions"] == "Be brief."
        assert [i["role"] for i in body["input"]] == ["user", "assistant", "user"]
        assert body["max_output_tokens"] == 50
        assert body["tools"][0]["name"] == "get_weather"
    assert body["temperature"] == 0.5
    # Reasoning controls are only sent when set.
    assert "reasoning_effort" not in body and "reasoning" not in body
    assert "chat_template_kwargs" not in body


@pytest.mark.parametrize("api", APIS)
async def test_reasoning_controls_are_passed_through(api: str, peer: ScriptedLlmServer) -> None:
    peer.add(Script(text_events(api, "Ok.")))
    await collect(api, peer.base_url, reasoning_effort="low", enable_thinking=False)
    body = peer.bodies()[0]
    if api == "chat-completions":
        assert body["reasoning_effort"] == "low"
    else:
        assert body["reasoning"] == {"effort": "low"}
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    # Reasoning models refuse a non-default temperature.
    assert "temperature" not in body


@pytest.mark.parametrize("api", APIS)
async def test_parallel_tool_calls_split_across_chunks_are_assembled(
    api: str, peer: ScriptedLlmServer
) -> None:
    calls = [
        ("call_a", "get_weather", '{"city": "Paris, France"}'),
        ("call_b", "get_weather", '{"city": "Oslo"}'),
    ]
    peer.add(Script(call_events(api, *calls)))
    outputs = await collect(api, peer.base_url)
    assert outputs == [ToolCall(*call) for call in calls]


@pytest.mark.parametrize("api", APIS)
async def test_tool_history_is_sent_in_the_api_s_shape(api: str, peer: ScriptedLlmServer) -> None:
    peer.add(Script(text_events(api, "It is sunny.")))
    call = ToolCall("call_a", "get_weather", '{"city": "Paris"}')
    messages = [
        *MESSAGES,
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "sunny, 24 C", tool_call_id="call_a"),
    ]
    llm = make_llm(api, peer.base_url)
    try:
        assert [o async for o in llm.stream_reply(messages, 50, 0.5)] == ["It is sunny."]
    finally:
        await llm.aclose()
    body = peer.bodies()[0]
    if api == "chat-completions":
        assistant, tool = body["messages"][-2:]
        assert assistant["tool_calls"][0]["id"] == "call_a"
        assert assistant["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'
        assert tool == {"role": "tool", "tool_call_id": "call_a", "content": "sunny, 24 C"}
    else:
        function_call, output = body["input"][-2:]
        assert function_call["type"] == "function_call" and function_call["call_id"] == "call_a"
        assert output == {
            "type": "function_call_output",
            "call_id": "call_a",
            "output": "sunny, 24 C",
        }


@pytest.mark.parametrize("api", APIS)
async def test_a_500_before_the_first_token_is_retried(api: str, peer: ScriptedLlmServer) -> None:
    peer.add(Script(status=500), Script(text_events(api, "Recovered.")))
    assert await collect(api, peer.base_url) == ["Recovered."]
    assert len(peer.requests) == 2


@pytest.mark.parametrize("api", APIS)
async def test_a_persistent_500_is_an_error_after_the_retries(
    api: str, peer: ScriptedLlmServer
) -> None:
    peer.add(Script(status=500), Script(status=500), Script(status=500))
    with pytest.raises(LlmError) as error:
        await collect(api, peer.base_url, retries=2)
    assert error.value.code == "http_500"
    assert "scripted failure 500" in str(error.value)
    assert len(peer.requests) == 3


async def test_a_client_error_is_not_retried(peer: ScriptedLlmServer) -> None:
    peer.add(Script(status=401), Script(text_events("chat-completions", "never")))
    with pytest.raises(LlmError) as error:
        await collect("chat-completions", peer.base_url, retries=3)
    assert error.value.code == "http_401"
    assert len(peer.requests) == 1


@pytest.mark.parametrize("api", APIS)
async def test_a_hang_before_the_first_token_times_out_and_hangs_up(
    api: str, peer: ScriptedLlmServer
) -> None:
    peer.add(Script(hang_before=True), Script(text_events(api, "x"), hang_after=0))
    with pytest.raises(LlmError) as error:
        await collect(api, peer.base_url, first_token_timeout_s=0.5, retries=1)
    assert error.value.code == "timeout"
    assert len(peer.requests) == 2  # one retry, then the error
    # Both abandoned requests were hung up on, so the server can stop work.
    await asyncio.wait_for(peer.wait_for_disconnects(2), 5)


@pytest.mark.parametrize("api", APIS)
async def test_a_connection_dropped_mid_stream_is_an_error_and_not_retried(
    api: str, peer: ScriptedLlmServer
) -> None:
    events = text_events(api, "First part, ", "second part.")
    first_text = next(i for i, e in enumerate(events) if "First" in str(e))
    peer.add(Script(events, drop_after=first_text + 1), Script(text_events(api, "again")))
    llm = make_llm(api, peer.base_url, retries=3)
    received: list[str | ToolCall] = []
    try:
        with pytest.raises(LlmError) as error:
            async for output in llm.stream_reply(MESSAGES, 50, 0.5):
                received.append(output)
    finally:
        await llm.aclose()
    assert error.value.code == "stream_interrupted"
    assert received == ["First part, "]
    assert len(peer.requests) == 1  # something was already said: no retry


@pytest.mark.parametrize("api", APIS)
async def test_closing_the_stream_closes_the_connection_upstream(
    api: str, peer: ScriptedLlmServer
) -> None:
    events = text_events(api, "One, ", "two, ", "three.")
    first_text = next(i for i, e in enumerate(events) if "One" in str(e))
    peer.add(Script(events, hang_after=first_text + 1))  # still "generating"
    llm = make_llm(api, peer.base_url, read_timeout_s=30)
    try:
        stream = llm.stream_reply(MESSAGES, 50, 0.5)
        assert await anext(stream) == "One, "
        assert peer.disconnects == 0
        await stream.aclose()  # type: ignore[attr-defined]
        await asyncio.wait_for(peer.disconnected.wait(), 5)
    finally:
        await llm.aclose()
    assert peer.disconnects == 1


async def test_cancelling_the_consumer_closes_the_connection_upstream(
    peer: ScriptedLlmServer,
) -> None:
    events = text_events("chat-completions", "One, ", "two.")
    peer.add(Script(events, hang_after=2))
    llm = make_llm("chat-completions", peer.base_url, read_timeout_s=30)
    got_first = asyncio.Event()

    async def consume() -> None:
        async for _ in llm.stream_reply(MESSAGES, 50, 0.5):
            got_first.set()

    task = asyncio.create_task(consume())
    try:
        await asyncio.wait_for(got_first.wait(), 5)
        task.cancel()
        await asyncio.wait_for(peer.disconnected.wait(), 5)
    finally:
        task.cancel()
        await llm.aclose()


async def test_an_unreachable_endpoint_is_a_clear_error() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(LlmError) as error:
        await collect("chat-completions", url, retries=1)
    assert error.value.code == "unreachable"
    assert url in str(error.value)


LLAMA_CONTEXT_ERROR = (
    b'error: {"code": 400, "message": "the request exceeds the available context size",'
    b' "type": "exceed_context_size_error"}\n\n'
)


@pytest.mark.parametrize(
    ("script", "code", "words"),
    [
        # llama.cpp's server reports mid-stream failures on an ``error:`` line.
        (Script(raw=LLAMA_CONTEXT_ERROR), "stream_error", "exceeds the available context"),
        (
            Script(raw=b'data: {"error": {"message": "model overloaded"}}\n\n'),
            "stream_error",
            "model overloaded",
        ),
        # A server that ignored "stream": true, or a proxy's HTML page.
        (
            Script(
                raw=b'{"choices": [{"message": {"content": "Hi"}}]}',
                content_type="application/json",
            ),
            "bad_stream",
            "application/json",
        ),
        (
            Script(raw=b"<html>Bad gateway</html>", content_type="text/html"),
            "bad_stream",
            "Bad gateway",
        ),
        # A payload cut off without its blank line.
        (Script(raw=b'data: {"choices": [{"delta"'), "bad_stream", "invalid JSON"),
        (Script(raw=b"data: " + b"x" * 1_000_000 + b"\n\n"), "bad_stream", "size limit"),
        (Script(raw=b"data: \xff\xfe\n\n"), "bad_stream", "UTF-8"),
    ],
)
async def test_a_stream_that_is_not_a_good_event_stream_is_a_clear_error(
    peer: ScriptedLlmServer, script: Script, code: str, words: str
) -> None:
    peer.add(script)
    with pytest.raises(LlmError) as error:
        await collect("chat-completions", peer.base_url)
    assert error.value.code == code and words in str(error.value), error.value
    assert len(peer.requests) == 1  # not retried: the same request would fail again


def slow_thinking(api: str, steps: int) -> list[dict[str, Any]]:
    """Reasoning deltas (never spoken) before the first words."""
    if api == "chat-completions":
        thinking = [chat_chunk({"reasoning_content": "hmm "}) for _ in range(steps)]
    else:
        thinking = [
            {"type": "response.reasoning_summary_text.delta", "item_id": "rs_1", "delta": "hmm "}
        ] * steps
    return [*thinking, *text_events(api, "Sunny.")]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("kind", ["reasoning", "tool call"])
async def test_a_long_reasoning_or_tool_call_is_not_a_first_token_timeout(
    api: str, kind: str, peer: ScriptedLlmServer
) -> None:
    """The first-token deadline ends once the model shows progress; the read timeout stays."""
    long_args = '{"city": "' + "Paris " * 12 + '"}'
    if kind == "reasoning":
        events = slow_thinking(api, 12)
        expected: list[str | ToolCall] = ["Sunny."]
    else:
        events = call_events(api, ("call_1", "get_weather", long_args))
        expected = [ToolCall("call_1", "get_weather", long_args)]
    # About 2.4 s in all, far beyond the 0.5 s first-token deadline; 0.2 s gaps.
    peer.add(Script(events, interval_s=2.4 / len(events)))
    outputs = await collect(api, peer.base_url, first_token_timeout_s=0.5, retries=0)
    assert outputs == expected
    assert len(peer.requests) == 1
