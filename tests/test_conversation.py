from __future__ import annotations

import itertools

from voice_agent.backends.base import ChatMessage, ToolCall
from voice_agent.session.conversation import Conversation, SpokenPiece, SpokenText


def talk(conversation: Conversation, turns: int) -> None:
    for i in range(turns):
        conversation.add_user(f"question {i}")
        conversation.add_assistant(f"answer {i}")


def test_prompt_is_instructions_history_then_the_new_question() -> None:
    conversation = Conversation("Be brief.", history_turns=4)
    talk(conversation, 1)
    assert conversation.messages_for("next") == [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "question 0"),
        ChatMessage("assistant", "answer 0"),
        ChatMessage("user", "next"),
    ]


def test_history_is_trimmed_in_blocks_so_the_prompt_prefix_stays_stable() -> None:
    conversation = Conversation("", history_turns=4)
    first_messages = []
    for turn in range(12):
        conversation.add_user(f"q{turn}")
        conversation.add_assistant(f"a{turn}")
        first_messages.append(conversation.history[0].content)
        assert len(conversation.history) <= 8
        assert conversation.history[0].role == "user"
    # Sliding one turn at a time would change the prefix on 8 of these turns.
    changes = sum(1 for a, b in itertools.pairwise(first_messages) if a != b)
    assert changes == 3
    assert conversation.history[-1] == ChatMessage("assistant", "a11")


def test_a_turns_prompt_holds_the_history_as_it_stands_once_the_words_join_it() -> None:
    # The prefill made once the last reply joined the history (empty words),
    # the reply's prompt and the history once the words join it must share
    # their prefix on every turn, the ones that overflow the window included:
    # the LLM server's cache holds it.
    for window in (1, 2, 4):
        conversation = Conversation("Be brief.", history_turns=window)
        for turn in range(12):
            prefill = conversation.messages_for("")
            prompt = conversation.messages_for(f"q{turn}")
            assert prompt[:-1] == prefill[:-1]
            assert prompt[-1] == ChatMessage("user", f"q{turn}")
            conversation.add_user(f"q{turn}")
            assert prompt == conversation.prompt(conversation.history)
            conversation.add_assistant(f"a{turn}")


def test_every_prompt_holds_the_last_exchange_and_at_most_the_window() -> None:
    for window in (1, 2, 4):
        conversation = Conversation("", history_turns=window)
        held = []
        for turn in range(12):
            prompt = conversation.messages_for(f"q{turn}")
            if turn:
                assert prompt[-3:-1] == [
                    ChatMessage("user", f"q{turn - 1}"),
                    ChatMessage("assistant", f"a{turn - 1}"),
                ]
            held.append((len(prompt) - 1) // 2)
            conversation.add_user(f"q{turn}")
            conversation.add_assistant(f"a{turn}")
        assert max(held) == window  # the window's every past turn, on some turns


def test_without_history_the_prompt_is_the_words_alone() -> None:
    conversation = Conversation("Be brief.", history_turns=0)
    talk(conversation, 2)
    assert conversation.messages_for("next") == [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "next"),
    ]


def test_tool_rounds_never_leave_a_call_or_result_without_its_question() -> None:
    # Each call and result is added on its own, and each add may cut: the cut
    # is always at a user's words, and an exchange that fills the window
    # (several tool rounds) is kept whole until the next words come.
    for window in (1, 2, 4):
        conversation = Conversation("", history_turns=window)
        for turn in range(8):
            conversation.add_user(f"q{turn}")
            for round_ in range(3 if turn % 2 else 1):
                call = ToolCall(f"call_{turn}_{round_}", "lookup", "{}")
                conversation.add(ChatMessage("assistant", "", tool_calls=(call,)))
                conversation.add(ChatMessage("tool", "found", tool_call_id=call.call_id))
            conversation.add_assistant(f"a{turn}")
            history = conversation.history
            assert history[0].role == "user"
            called = {c.call_id for m in history for c in m.tool_calls}
            assert all(m.tool_call_id in called for m in history if m.role == "tool")
            assert history[-1] == ChatMessage("assistant", f"a{turn}")


def test_an_empty_reply_is_not_recorded() -> None:
    conversation = Conversation("", history_turns=2)
    conversation.add_user("hello")
    conversation.add_assistant("")
    assert conversation.history == [ChatMessage("user", "hello")]


def test_no_history() -> None:
    conversation = Conversation("", history_turns=0)
    talk(conversation, 3)
    assert conversation.history == []


def test_a_tool_result_goes_right_after_its_call() -> None:
    """Chat Completions refuses anything between a tool_calls message and its results."""
    conversation = Conversation("", 10)
    call = ToolCall("call_1", "lookup", "{}")
    conversation.add_user("Where is my order?")
    conversation.add(ChatMessage("assistant", "", tool_calls=(call, ToolCall("call_2", "x", "{}"))))
    conversation.add(ChatMessage("tool", "first", tool_call_id="call_2"))
    conversation.add_user("Hello?")  # typed while the client was still running the tool
    assert conversation.has_open_call("call_1") and not conversation.has_open_call("call_2")
    conversation.add(ChatMessage("tool", "shipped", tool_call_id="call_1"))
    assert [(m.role, m.content) for m in conversation.history] == [
        ("user", "Where is my order?"),
        ("assistant", ""),
        ("tool", "first"),
        ("tool", "shipped"),
        ("user", "Hello?"),
    ]
    assert not conversation.has_open_call("call_1")
    assert not conversation.has_open_call("call_404")


def test_deleting_items_takes_their_words_out_of_the_history() -> None:
    conversation = Conversation("", 10)
    conversation.add_user("first", "item_1")
    call = ToolCall("call_1", "lookup", "{}")
    conversation.add(ChatMessage("assistant", "Let me look.", tool_calls=(call,)), "item_2")
    conversation.add(ChatMessage("tool", "found", tool_call_id="call_1"), "item_3")
    conversation.add_assistant("It is there.", "item_2")
    conversation.add_user("second", "item_4")

    assert conversation.delete("item_1") and not conversation.delete("item_1")
    # A reply's message: its words go, the call it made stays (an item of its own).
    assert conversation.delete("item_2")
    assert conversation.history == [
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "found", tool_call_id="call_1"),
        ChatMessage("user", "second"),
    ]
    # The call goes with its result: neither is valid without the other.
    assert conversation.delete_call("call_1")
    assert conversation.history == [ChatMessage("user", "second")]


def test_a_reply_is_truncated_to_the_words_heard_by_then() -> None:
    conversation = Conversation("", 10)
    # Two pieces of 50 frames (1 s) each; the second was cut after 25 frames.
    spoken = SpokenText(0, (SpokenPiece("one two", 50, 50), SpokenPiece("three four", 50, 25)))
    assert spoken.played_ms == 1500
    conversation.add_assistant("one two three", "item_1", spoken)
    assert conversation.truncate("item_1", 1500) == "one two three"
    assert conversation.truncate("item_1", 999) == "one"
    assert conversation.history == [ChatMessage("assistant", "one")]
    assert conversation.truncate("item_1", 0) == ""
    assert conversation.history == []
    assert conversation.truncate("item_1", 0) is None  # nothing of it left
