"""The session's replies: making them, playing one at a time, and the
client's and server's controls over them.

A reply is built from the session's settings and the request (history or
given context, tools, voice, audio or text), started at once (it may be a
speculation nobody sees yet) and committed when it is to be heard, which
supersedes the reply before it. Here too: the rules every part asks about
the reply being given (is one being given, may speech interrupt it, is a
turn answered now), the client's ``response.create`` / ``.cancel`` and
output clearing, the server's goodbye, the track's frame feedback, and
prefilling the LLM server (the history between turns, the caller's words
so far during one). Apart because it is the output side of the session:
the other parts decide *that* a reply is due, this one owns the
``Reply`` objects.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from voice_agent.backends.base import ChatMessage, ToolChoice, ToolSpec
from voice_agent.session.events import AssistantAudioCleared, SessionError
from voice_agent.session.ids import new_id
from voice_agent.session.metrics import TurnMetrics
from voice_agent.session.reply import PieceTag, Reply
from voice_agent.session.state import SessionState

# The session's parts log as the session: one logger name to filter and set levels on.
log = logging.getLogger("voice_agent.session.session")


@dataclass(frozen=True)
class ResponseRequest:
    """What a client asks of one reply (beyond answering the conversation)."""

    instructions: str | None = None
    max_output_tokens: int | None = None
    in_conversation: bool = True  # False: out of band, the history never sees it
    context: tuple[ChatMessage, ...] | None = None  # what it answers instead of the history
    metadata: Mapping[str, str] | None = None
    audio: bool | None = None  # None: as the session's replies
    tools: tuple[ToolSpec, ...] | None = None  # the client's tools for it (None: the session's)
    tool_choice: ToolChoice | None = None
    voice: str | None = None  # one of the TTS's voices (None: the session's)


class Replies(SessionState):
    """Makes, plays, cancels and reports the session's replies."""

    def _replying(self) -> bool:
        return self._response is not None and self._response.status == "in_progress"

    def _interrupts(self) -> bool:
        return self.turn_detection is None or self.turn_detection.interrupt_response

    def _answers_turns(self) -> bool:
        """Whether a turn that ends is answered now: turns are detected, with
        replies, and speaking may interrupt the reply being given if there is one."""
        detection = self.turn_detection
        if detection is None or not detection.create_response:
            return False
        return detection.interrupt_response or not self._replying()

    @property
    def tools(self) -> list[ToolSpec]:
        server = self.config.tools.specs if self.config.tools is not None else []
        return [*server, *self.client_tools]

    def _new_response(
        self,
        user_text: str | None,
        metrics: TurnMetrics,
        request: ResponseRequest | None = None,
        failure: SessionError | None = None,
        script: str | None = None,
    ) -> Reply:
        request = request or ResponseRequest()
        reply = self.config.reply
        if request.max_output_tokens is not None:
            reply = dataclasses.replace(reply, max_tokens=request.max_output_tokens)
        if request.context is not None:
            messages = self.conversation.prompt(list(request.context), request.instructions)
        else:
            messages = self.conversation.messages_for(user_text, request.instructions)
        tools = self.tools
        if request.tools is not None:
            server = self.config.tools.specs if self.config.tools is not None else []
            tools = [*server, *request.tools]
        response = Reply(
            response_id=new_id("resp"),
            item_id=new_id("item"),
            messages=messages,
            llm=self._reply_llm,
            tts=self.models.tts,
            output=self.output,
            conversation=self.conversation if request.in_conversation else None,
            emit=self._emit,
            reply=reply,
            metrics=metrics,
            on_finished=self._on_response_finished,
            tools=tools,
            tool_choice=self.tool_choice if request.tool_choice is None else request.tool_choice,
            server_tools=self.config.tools,
            failure=failure,
            audio=self.audio_output if request.audio is None else request.audio,
            metadata=request.metadata,
            script=script,
            voice=self.voice if request.voice is None else request.voice,
        )
        self._live_responses.add(response)
        self._prefills.cancel()  # the real request must not compete with a warm-up
        response.start()
        # Tracked until its tasks have stopped, not merely until it is
        # cancelled, so closing the session waits for them.
        response.closed_callbacks.append(self._live_responses.discard)
        return response

    def _commit_reply(self, response: Reply) -> None:
        """Make ``response`` the one being given (the one before it is
        superseded) and let it start speaking."""
        if self._ending and response.script is None:
            response.cancel("server_shutdown")  # a turn that ended as the call did
            return
        if self._response is not None and self._response.status == "in_progress":
            self._response.cancel("superseded")
        self._response = response
        response.commit()

    def create_response(self, request: ResponseRequest | None = None) -> bool:
        """Reply to the conversation as it stands (``response.create``), or
        to the context the request gives; False while a reply is being given."""
        if self._closed or self._ending or self._replying() or self._deferred_reply is not None:
            return False
        self._drop_speculation()
        transcribing = [task for task in self._turn_tasks if not task.done()]
        if transcribing:
            # A turn committed just before (push-to-talk: commit, then
            # response.create) is part of what this reply answers.
            self._deferred_reply = asyncio.create_task(
                self._reply_after(transcribing, request), name="reply-after-turn"
            )
            return True
        self._commit_reply(self._new_response(None, TurnMetrics(), request))
        return True

    async def _reply_after(
        self, turns: list[asyncio.Task[None]], request: ResponseRequest | None
    ) -> None:
        try:
            await asyncio.wait(turns)
        finally:
            if self._deferred_reply is asyncio.current_task():
                self._deferred_reply = None
        # That turn may have been answered by itself (turn detection on).
        if not self._closed and not self._replying():
            self._commit_reply(self._new_response(None, TurnMetrics(), request))

    def cancel_response(self, reason: str = "client_cancelled") -> bool:
        """Cancel the reply being played (or waiting for a turn's transcript);
        False when there is none."""
        self._drop_speculation()
        if self._deferred_reply is not None:
            self._deferred_reply.cancel()
            self._deferred_reply = None
            return True
        if self._response is None or not self._replying():
            return False
        self._response.cancel(reason)
        return True

    def say_goodbye(self, text: str) -> Reply | None:
        """The last reply of a call the server ends (a drain): the reply being
        given stops, these words are spoken (no LLM, outside the history),
        and nothing the caller says or asks starts another one. Its
        ``wait_closed`` returns once the words have been played. None once
        the session is closed: nothing would play it, or ever stop it."""
        if self._closed:
            return None
        self._ending = True
        self._drop_speculation()
        if self._deferred_reply is not None:
            self._deferred_reply.cancel()
            self._deferred_reply = None
        if self._replying():
            assert self._response is not None
            self._response.cancel("server_shutdown")
        response = self._new_response(
            None, TurnMetrics(), ResponseRequest(in_conversation=False), script=text
        )
        self._commit_reply(response)
        return response

    def clear_output(self) -> None:
        """Drop all buffered assistant audio (and the reply producing it)."""
        response = self._response
        if response is not None and response.status == "in_progress":
            response.cancel("client_cancelled")
        else:
            self.output.flush()
            if response is not None:
                self._emit(AssistantAudioCleared(response.response_id))

    def frame_sent(self, tag: Any) -> None:
        """Called by the output track for every audio frame it sends."""
        response = self._response
        if (
            isinstance(tag, PieceTag)
            and response is not None
            and tag.response_id == response.response_id
        ):
            response.frame_sent(tag)

    def _on_response_finished(self, response: Reply) -> None:
        self._barge_in.finished(response)
        if response is self._response:
            held, self._held_texts = self._held_texts, []
            for text, item_id in held:
                self.conversation.add_user(text, item_id)
        self.prefill_next_turn()
        log.info(
            "turn finished",
            extra={
                "session": self.id,
                "response_id": response.response_id,
                "status": response.status,
                "speculative": response.metrics.speculative,
                **response.metrics.record(),
            },
        )

    def prefill_next_turn(self) -> None:
        """Let the LLM server process the conversation so far while the user
        is still speaking. On a CPU, prompt processing costs ~10 ms a token:
        without this, every turn pays for the previous reply again (its text
        no longer matches the server's cache once cut or re-tokenised), and a
        history window that slides pays for the whole history."""
        if not self.config.prefill or self._closed or self._ending:
            return
        self._prefills.history(self.conversation.messages_for(""), self.tools)

    def _prefill_words(self, words: str) -> None:
        """A partial transcript of the turn in progress: the LLM processes
        these words now, so the reply's prompt only adds the last few. Not
        once the user has paused (the speculative reply's request follows
        and must find the server free), nor for a turn that won't be answered."""
        if self._closed or self._ending or self._item_id is None:
            return
        if self._speculation is not None or not self._answers_turns():
            return
        self._prefills.words(words, self.conversation.messages_for(words), self.tools)
