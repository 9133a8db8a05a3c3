"""The words' end of turn: how likely a sentence ends where the caller's
words stop, read from a language model's next-token probabilities.

Smart Turn hears how the voice stopped, not what was said; a caller who
pauses after "please check" in a falling tone sounds done, and a reader
whose voice stays up at the end of "he was not an ill-disposed young man"
sounds unfinished. A language model reads the other half: after "please
check" it expects more words, after "...young man" a full stop. The
embedded llama.cpp server already holds one (SmolLM2-135M), so asking it
costs one short prompt and no download or memory.

The words go in as a chat user message that is still open, lowercased and
without punctuation (the transcript's own full stops would answer the
question), and the answer is the probability of the next token being a
sentence's end: ".", "?", "!" or the end of the message. On the tuning
set (bench/speech_sets.py, Whisper's transcripts of 29 prompts cut at a
pause in their middle), the whole prompts scored 0.15 or more in 24, the
words before the pause in 9 (most of them clauses that stand alone:
"please enter your conference number").

The prompt is rendered by the server's own chat template (its
``/apply-template``). The thresholds the session applies were set on
SmolLM2-135M's answers, so the engine uses this only with that model.
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

# The model's next token after the words: those that end a sentence.
SENTENCE_ENDS = ".?!"
TOP_TOKENS = 20  # probabilities beyond the 20 likeliest tokens are ~0 here
MARKER = "\u2063WORDS\u2063"  # stands for the words when the template is rendered
INSTRUCTIONS = "You are a helpful voice assistant."


def plain_words(text: str) -> str:
    """The transcript as the model should read it: lowercase words only."""
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


class WordsJudge:
    """P(the sentence ends here) for a transcript, from a llama.cpp server."""

    name = "llama-words"

    def __init__(self, server_url: str, timeout_s: float = 1.0) -> None:
        # The OpenAI-style base (".../v1") or the server's root.
        self._root = server_url.rstrip("/").removesuffix("/v1")
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._http: aiohttp.ClientSession | None = None
        self._template: tuple[str, str] | None = None  # (before the words, the message's end)
        self._template_lock = asyncio.Lock()

    async def completion(self, text: str) -> float:
        """Probability that a sentence ends after ``text`` (0 for no words)."""
        words = plain_words(text)
        if not words:
            return 0.0
        before, message_end = await self._prompt_parts()
        body = {
            "prompt": before + words,
            "n_predict": 1,
            "n_probs": TOP_TOKENS,
            "temperature": 0,
            "cache_prompt": True,
        }
        answer = await self._post("/completion", body)
        tops = answer["completion_probabilities"][0]["top_logprobs"]
        return min(1.0, sum(math.exp(t["logprob"]) for t in tops if _ends(t["token"], message_end)))

    async def _prompt_parts(self) -> tuple[str, str]:
        """The rendered chat up to where the user's words go, and the token
        text that closes a user message (``<|im_end|>`` in ChatML)."""
        async with self._template_lock:
            if self._template is None:
                messages = [
                    {"role": "system", "content": INSTRUCTIONS},
                    {"role": "user", "content": MARKER},
                ]
                rendered = (await self._post("/apply-template", {"messages": messages}))["prompt"]
                before, _, after = rendered.partition(MARKER)
                self._template = (before, after.strip().split("\n", 1)[0].strip())
            return self._template

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        if self._http is None:
            self._http = aiohttp.ClientSession(timeout=self._timeout)
        async with self._http.post(self._root + path, json=body) as response:
            response.raise_for_status()
            answer: dict[str, Any] = await response.json()
            return answer

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


def _ends(token: str, message_end: str) -> bool:
    """Whether the next token ends the sentence: ".", "?" or "!" ("...":
    the words trail off), or ends the message: its end token, which the
    server renders as nothing (special tokens are not rendered) or as
    itself, or a line break."""
    said = token.strip()
    if not said or said == message_end:
        return True
    return said[0] in SENTENCE_ENDS and not said.startswith("..")


async def words_judge(server_url: str | None) -> WordsJudge | None:
    """A words judge on that llama.cpp server, having read some words once
    (its chat template fetched, the prompt's start cached before the first
    caller pauses); None without a server, or when it cannot answer (no
    ``/apply-template`` or ``/completion``: logged, and turns are judged by
    the voice alone)."""
    if server_url is None:
        return None
    judge = WordsJudge(server_url)
    try:
        await judge.completion("Hello there.")
    except Exception as exc:
        log.warning(
            "end-of-turn words judge off: the LLM server did not answer",
            extra={"url": server_url, "error": repr(exc)},
        )
        await judge.close()
        return None
    return judge
