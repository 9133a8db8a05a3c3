"""Streaming HTTP to an OpenAI-compatible endpoint: server-sent events,
timeouts, retries before the first token, and closing the connection when
the consumer stops.

Raw aiohttp rather than the ``openai`` SDK: a voice turn needs a deadline on
the *first token* (not only on the whole request), retries that stop the
moment anything has been spoken, and a guarantee that abandoning the stream
closes the socket so the server stops generating.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp.http_exceptions import LineTooLong

from voice_agent.backends.base import LlmError, ToolCall

log = logging.getLogger(__name__)

# What a caller is told when the LLM's stream reports an error (its words
# go to the log).
REPORTED_ERROR = "the LLM reported an error"

Output = str | ToolCall
MAX_ERROR_BODY = 2000


@dataclass(frozen=True)
class HttpLlmConfig:
    base_url: str
    api_key: str | None
    model: str
    connect_timeout_s: float = 5.0
    first_token_timeout_s: float = 15.0
    read_timeout_s: float = 15.0
    total_timeout_s: float | None = None
    retries: int = 2
    backoff_s: float = 0.25
    reasoning_effort: str | None = None
    enable_thinking: bool | None = None
    # llama-server closes the connection after each streamed reply while
    # announcing keep-alive: a pooled connection then fails the next request
    # ("Server disconnected"). Its loopback connect costs ~0.1 ms.
    keep_alive: bool = True


class StreamParser(Protocol):
    """Turns one attempt's decoded SSE events into outputs (stateful).
    ``progressed`` turns true on the first event that shows the model at work
    without output yet (reasoning, tool-call fragments): that ends the
    first-token deadline, since such a phase may rightly last long."""

    progressed: bool

    def feed(self, event: dict[str, Any]) -> Iterable[Output]: ...

    def finish(self) -> Iterable[Output]: ...


class _Retryable(Exception):
    def __init__(self, error: LlmError) -> None:
        super().__init__(str(error))
        self.error = error


async def sse_events(response: aiohttp.ClientResponse) -> AsyncIterator[dict[str, Any]]:
    """The JSON payloads of a text/event-stream body, until ``[DONE]`` or EOF.
    Errors the stream reports (an ``error:`` field, as llama.cpp's server
    sends when the prompt exceeds its context, or an ``{"error": ...}``
    payload) and bodies that are not event streams raise ``LlmError``."""
    content_type = response.headers.get("Content-Type", "")
    if not content_type.lower().startswith("text/event-stream"):
        # JSON (a server that ignored "stream": true), an HTML error page...
        text = (await response.text(errors="replace"))[:MAX_ERROR_BODY]
        raise LlmError(
            "bad_stream",
            f"the LLM endpoint answered {content_type or 'no content type'}, "
            f"not an event stream: {_error_message(text)}",
            "the LLM endpoint did not answer with an event stream",
        )
    data: list[str] = []
    try:
        async for raw in response.content:
            line = raw.decode("utf-8").rstrip("\r\n")
            if line.startswith("error:"):
                message = _error_message(line[6:].strip())
                raise LlmError(
                    "stream_error", f"the LLM reported an error: {message}", REPORTED_ERROR
                )
            if line.startswith("data:"):
                data.append(line[5:].removeprefix(" "))
                continue
            if line or not data:
                continue  # "event:", "id:", comments; or a blank line without data
            payload, data = "\n".join(data), []
            if payload == "[DONE]":
                return
            event = _event(payload)
            if event is not None:
                yield event
    except LineTooLong:
        raise LlmError("bad_stream", "the LLM stream sent a line over the size limit") from None
    except UnicodeDecodeError:
        raise LlmError("bad_stream", "the LLM stream is not UTF-8") from None
    if data and data != ["[DONE]"]:
        event = _event("\n".join(data))
        if event is not None:
            yield event


def _event(payload: str) -> dict[str, Any] | None:
    try:
        event = json.loads(payload)
    except ValueError:
        message = f"the endpoint sent invalid JSON: {payload[:200]}"
        raise LlmError("bad_stream", message, "the LLM stream sent invalid JSON") from None
    if not isinstance(event, dict):
        return None
    if event.get("error") and "type" not in event:
        # Typed events ("error", "response.failed") are the parser's to read.
        message = f"the LLM reported an error: {_error_message(payload)}"
        raise LlmError("stream_error", message, REPORTED_ERROR)
    return event


class HttpLlmClient:
    """One connection pool per backend, shared by every session."""

    def __init__(self, config: HttpLlmConfig) -> None:
        self.config = config
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(force_close=not self.config.keep_alive)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return headers

    def sampling_fields(self, temperature: float) -> dict[str, Any]:
        """No temperature with a reasoning effort: OpenAI's reasoning models
        refuse any but the default (a 400 on every turn)."""
        return {} if self.config.reasoning_effort is not None else {"temperature": temperature}

    def reasoning_fields(self, responses_api: bool) -> dict[str, Any]:
        """Reasoning controls, only when set: servers that don't know them may refuse them."""
        body: dict[str, Any] = {}
        effort = self.config.reasoning_effort
        if effort is not None:
            body.update({"reasoning": {"effort": effort}} if responses_api else {})
            body.update({} if responses_api else {"reasoning_effort": effort})
        if self.config.enable_thinking is not None:
            # vLLM, SGLang and llama.cpp read this for Qwen3-style templates.
            body["chat_template_kwargs"] = {"enable_thinking": self.config.enable_thinking}
        return body

    async def stream(
        self, path: str, body: dict[str, Any], parser_factory: type[StreamParser]
    ) -> AsyncIterator[Output]:
        """Stream ``parser_factory``'s outputs for one request. Connection
        failures, 5xx/429 answers and timeouts before the first output are
        retried with backoff; after it, any failure raises ``LlmError``."""
        cfg = self.config
        url = cfg.base_url.rstrip("/") + path
        attempts = cfg.retries + 1
        attempt = 0
        while True:
            try:
                response, events, parser, first = await self._open(url, body, parser_factory)
                break
            except _Retryable as exc:
                error = exc.error
                attempt += 1
                if attempt == attempts:
                    raise error from None
                delay = cfg.backoff_s * 2 ** (attempt - 1)
                log.warning(
                    "llm request failed, retrying",
                    extra={"code": error.code, "error": str(error), "retry_in_s": delay},
                )
                await asyncio.sleep(delay)
        try:
            for output in first:
                yield output
            try:
                async for event in events:
                    for output in parser.feed(event):
                        yield output
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise LlmError(
                    "stream_interrupted",
                    f"the LLM stream broke off: {_describe(exc)}",
                    "the LLM stream broke off",
                ) from None
            for output in parser.finish():
                yield output
        finally:
            # Closing (not releasing) drops the socket, so the server sees the
            # disconnect and stops generating: barge-in, hang-up, cancel.
            response.close()

    async def _open(
        self, url: str, body: dict[str, Any], parser_factory: type[StreamParser]
    ) -> tuple[aiohttp.ClientResponse, AsyncIterator[dict[str, Any]], StreamParser, list[Output]]:
        """Send the request and wait for the first output or sign of
        progress (or the end); from there on ``sock_read`` bounds each gap."""
        cfg = self.config
        timeout = aiohttp.ClientTimeout(
            total=cfg.total_timeout_s,
            sock_connect=cfg.connect_timeout_s,
            sock_read=cfg.read_timeout_s,
        )
        response: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout(cfg.first_token_timeout_s):
                response = await self._http().post(
                    url, json=body, headers=self.headers(), timeout=timeout
                )
                if response.status >= 400:
                    text = (await response.text(errors="replace"))[:MAX_ERROR_BODY]
                    error = LlmError(
                        f"http_{response.status}",
                        f"the LLM endpoint answered {response.status}: {_error_message(text)}",
                        f"the LLM endpoint answered {response.status}",
                    )
                    if response.status >= 500 or response.status in (408, 429):
                        raise _Retryable(error)
                    raise error
                parser = parser_factory()
                events = sse_events(response)
                first: list[Output] = []
                async for event in events:
                    first = list(parser.feed(event))
                    if first or parser.progressed:
                        break
                return response, events, parser, first
        except (_Retryable, LlmError):
            if response is not None:
                response.close()
            raise
        except TimeoutError:
            if response is not None:
                response.close()
            raise _Retryable(
                LlmError(
                    "timeout", f"no first token from the LLM within {cfg.first_token_timeout_s} s"
                )
            ) from None
        except aiohttp.ClientError as exc:
            if response is not None:
                response.close()
            raise _Retryable(
                LlmError(
                    "unreachable",
                    f"the LLM endpoint {url} failed: {_describe(exc)}",
                    "the LLM endpoint could not be reached",
                )
            ) from None
        except BaseException:
            if response is not None:
                response.close()
            raise

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


def _describe(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _error_message(text: str) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the body."""
    try:
        body = json.loads(text)
    except ValueError:
        return text.strip() or "(empty body)"
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return str(error["message"])
        if isinstance(error, str):
            return error
    return text.strip()
