"""Client-side tools and LLM failures over WebRTC with a real aiortc peer:
the function call arrives on the data channel, the peer answers it, and the
answer is spoken; a dead LLM endpoint is apologised for out loud."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests import conftest
from tests.realtime_events import typed
from voice_agent.client import RealtimeClient
from voice_agent.engine import Engine
from voice_agent.testing.ports import free_port
from voice_agent.testing.scripted_llm import (
    Script,
    ScriptedLlmServer,
    call_events,
    chat_text,
    close_quietly,
    engine_with_llm,
    make_llm,
    text_events,
)

pytestmark = pytest.mark.e2e
API = "chat-completions"
APIS = ["chat-completions", "responses"]
ORDER_TOOL = {
    "type": "function",
    "name": "get_order_status",
    "description": "Status of an order by its id.",
    "parameters": {
        "type": "object",
        "properties": {"order_id": {"type": "string"}},
        "required": ["order_id"],
    },
}


@pytest.mark.parametrize("api", APIS)
async def test_a_client_tool_call_is_answered_by_the_client_and_the_answer_spoken(
    engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession, api: str
) -> None:
    llm = make_llm(api, peer.base_url)
    scripted = engine_with_llm(engine, llm, llm_prefill=False)
    async with conftest.run_server(conftest.test_settings(), scripted) as server:
        client = RealtimeClient(server.url)
        await client.connect(http)
        client.send({"type": "session.update", "session": {"tools": [ORDER_TOOL]}})
        updated = await asyncio.wait_for(client.wait_for_type("session.updated"), 5)
        assert updated["session"]["tools"] == [ORDER_TOOL]

        peer.add(
            Script(call_events(api, ("call_7", "get_order_status", '{"order_id": "A17"}'))),
            Script(text_events(api, "Your order A17 ", "has shipped.")),
        )
        client.send(typed("Where is my order A17?"))
        client.send(
            {
                "type": "response.create",
                "response": {"instructions": "Use the tools.", "max_output_tokens": 33},
            }
        )
        args = await asyncio.wait_for(
            client.wait_for_type("response.function_call_arguments.done"), 15
        )
        assert (args["call_id"], args["name"], args["arguments"]) == (
            "call_7",
            "get_order_status",
            '{"order_id": "A17"}',
        )
        first = (await asyncio.wait_for(client.wait_for_type("response.done"), 15))["response"]
        assert first["status"] == "completed"
        # A reply that only calls a function has no (empty) message item.
        (call_item,) = first["output"]
        assert call_item["type"] == "function_call" and call_item["call_id"] == "call_7"
        added = [
            (e["output_index"], e["item"]["type"])
            for e in client.of_type("response.output_item.added")
        ]
        assert added == [(0, "function_call")]
        request = peer.bodies()[0]
        question = {"role": "user", "content": "Where is my order A17?"}
        if api == "chat-completions":
            assert request["messages"][0] == {"role": "system", "content": "Use the tools."}
            assert request["messages"][-1] == question
            assert request["max_tokens"] == 33
            assert request["tools"][0]["function"]["name"] == "get_order_status"
        else:
            assert request["instructions"] == "Use the tools."
            assert request["input"][-1] == question
            assert request["max_output_tokens"] == 33
            assert request["tools"][0]["name"] == "get_order_status"

        # The client runs the function and asks for the next reply.
        mark = len(client.events)
        client.send(
            {
                "type": "conversation.item.create",
                "item": {
                    "type": "function_call_output",
                    "call_id": "call_7",
                    "output": '{"status": "shipped"}',
                },
            }
        )
        asked_at = time.monotonic()
        client.send({"type": "response.create"})
        done = await asyncio.wait_for(client.wait_for_type("response.done", after=mark), 20)
        second = done["response"]
        assert second["status"] == "completed"
        assert second["output"][0]["content"][0]["transcript"] == "Your order A17 has shipped."
        # The call and then its result, in that order, reach the model.
        if api == "chat-completions":
            call, result = peer.bodies()[1]["messages"][-2:]
            assert call["tool_calls"][0]["id"] == "call_7"
            assert result == {
                "role": "tool",
                "tool_call_id": "call_7",
                "content": '{"status": "shipped"}',
            }
        else:
            call, result = peer.bodies()[1]["input"][-2:]
            assert call["type"] == "function_call" and call["call_id"] == "call_7"
            assert result == {
                "type": "function_call_output",
                "call_id": "call_7",
                "output": '{"status": "shipped"}',
            }
        # The answer was spoken: audible audio came back.
        first_sound = client.received.first_sound_after(asked_at)
        assert first_sound is not None
        await client.hangup(http)
        await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    await close_quietly(llm)


async def test_a_client_answering_on_output_item_done_gets_its_next_reply(
    engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    """The OpenAI Agents SDK answers a call as soon as its output_item.done
    arrives: by then the reply (whose words are still being spoken) must be
    done, and its items must come in GA order: message (0), then the call (1)."""
    llm = make_llm(API, peer.base_url)
    scripted = engine_with_llm(engine, llm, llm_prefill=False)
    async with conftest.run_server(conftest.test_settings(), scripted) as server:
        client = RealtimeClient(server.url)
        await client.connect(http)
        client.send({"type": "session.update", "session": {"tools": [ORDER_TOOL]}})
        await asyncio.wait_for(client.wait_for_type("session.updated"), 5)
        words = chat_text("Let me check that order for you, one moment please. ")[:-1]
        call = call_events(API, ("call_7", "get_order_status", '{"order_id": "A17"}'))
        peer.add(Script(words + call), Script(text_events(API, "It has shipped.")))
        client.send(typed("Where is my order A17?"))
        client.send({"type": "response.create"})
        call_done = await asyncio.wait_for(
            client.wait_for(
                lambda e: (
                    e.get("type") == "response.output_item.done"
                    and e["item"]["type"] == "function_call"
                )
            ),
            20,
        )
        mark = len(client.events)
        client.send(
            {
                "type": "conversation.item.create",
                "item": {"type": "function_call_output", "call_id": "call_7", "output": "shipped"},
            }
        )
        client.send({"type": "response.create"})
        second = await asyncio.wait_for(
            client.wait_for(
                lambda e: (
                    e.get("type") == "response.done"
                    and e["response"]["id"] != call_done["response_id"]
                ),
                after=mark,
            ),
            20,
        )
        assert second["response"]["status"] == "completed"
        assert client.of_type("error") == []
        assert second["response"]["output"][0]["content"][0]["transcript"] == "It has shipped."
        first_id = call_done["response_id"]
        outputs = [
            (e["type"], e["output_index"], e["item"]["type"])
            for e in client.events
            if e.get("type", "").startswith("response.output_item.")
            and e.get("response_id") == first_id
        ]
        assert outputs == [
            ("response.output_item.added", 0, "message"),
            ("response.output_item.done", 0, "message"),
            ("response.output_item.added", 1, "function_call"),
            ("response.output_item.done", 1, "function_call"),
        ]
        await client.hangup(http)
        await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    await close_quietly(llm)


async def test_a_message_typed_during_a_reply_follows_that_reply_in_the_history(
    engine: Engine, peer: ScriptedLlmServer, http: aiohttp.ClientSession
) -> None:
    llm = make_llm(API, peer.base_url)
    scripted = engine_with_llm(engine, llm, llm_prefill=False)
    async with conftest.run_server(conftest.test_settings(), scripted) as server:
        client = RealtimeClient(server.url)
        await client.connect(http)
        peer.add(
            Script(text_events(API, "Paris is the capital of France, on the Seine.")),
            Script(text_events(API, "About two million people.")),
        )
        client.send(typed("Tell me about Paris."))
        client.send({"type": "response.create"})
        await asyncio.wait_for(client.wait_for_type("output_audio_buffer.started"), 20)
        client.send(typed("How many people live there?"))  # while the reply is spoken
        first = await asyncio.wait_for(client.wait_for_type("response.done"), 20)
        assert first["response"]["status"] == "completed"
        mark = len(client.events)
        client.send({"type": "response.create"})
        await asyncio.wait_for(client.wait_for_type("response.done", after=mark), 20)
        history = [(m["role"], m["content"]) for m in peer.bodies()[1]["messages"][1:]]
        assert history == [
            ("user", "Tell me about Paris."),
            ("assistant", "Paris is the capital of France, on the Seine."),
            ("user", "How many people live there?"),
        ]
        await client.hangup(http)
        await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    await close_quietly(llm)


async def test_a_dead_llm_endpoint_gets_an_error_and_a_spoken_apology(
    engine: Engine, http: aiohttp.ClientSession
) -> None:
    llm = make_llm(API, f"http://127.0.0.1:{free_port()}/v1", retries=1)
    scripted = engine_with_llm(engine, llm, llm_prefill=False)
    async with conftest.run_server(conftest.test_settings(), scripted) as server:
        client = RealtimeClient(server.url)
        await client.connect(http)
        await asyncio.wait_for(client.wait_for_type("session.created"), 5)
        client.send(typed("Hello?"))
        asked_at = time.monotonic()
        client.send({"type": "response.create"})
        done = (await asyncio.wait_for(client.wait_for_type("response.done"), 20))["response"]
        assert done["status"] == "failed"
        assert done["status_details"]["error"]["code"] == "unreachable"
        (error,) = client.of_type("error")
        assert error["error"]["code"] == "unreachable"
        apology = engine.settings.llm_apology
        assert done["output"][0]["content"][0]["transcript"] == apology
        assert client.received.first_sound_after(asked_at) is not None
        await client.hangup(http)
        await asyncio.wait_for(server.calls.wait_for_count(0), 5)
    await close_quietly(llm)
