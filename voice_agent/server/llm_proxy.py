"""The configured LLM, re-exposed for a client's side tasks (summaries,
titles, classification) at ``POST /v1/chat/completions`` and
``POST /v1/responses`` (``--enable-llm-proxy``, off by default).

Requests are forwarded with the server's model and key (clients never see
the key), and within the operator's limits: only the body fields a side
task needs (``CHAT_FIELDS``, ``RESPONSES_FIELDS``; anything else, such as
llama.cpp's ``id_slot`` or ``grammar`` or OpenAI's ``n``, is refused by
name), at most ``--llm-proxy-max-tokens`` tokens a reply (also when the
client asks for none or more), and at most ``--llm-proxy-max-concurrent``
requests at once (beyond: 429), so side tasks never take every slot the
live calls' replies need. Replies (streamed or not) are passed through
chunk by chunk. A client
that goes away ends the upstream request at once, also before the first
byte: the server runs with ``handler_cancellation``, so this handler is
cancelled and its ``finally`` closes the upstream connection.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

import aiohttp
from aiohttp import web

from voice_agent import strict_json
from voice_agent.backends.llm.http_client import HttpLlmConfig
from voice_agent.server.errors import error_response
from voice_agent.server.route_marks import checks_its_own_caller

log = logging.getLogger(__name__)

PATHS = {"/v1/chat/completions": "/chat/completions", "/v1/responses": "/responses"}
_COMMON = {"model", "stream", "temperature", "top_p", "tools", "tool_choice", "user"}
CHAT_FIELDS = frozenset(
    _COMMON
    | {"messages", "stream_options", "max_tokens", "max_completion_tokens", "stop",
       "response_format", "parallel_tool_calls", "seed", "presence_penalty",
       "frequency_penalty", "reasoning_effort"}
)  # fmt: skip
RESPONSES_FIELDS = frozenset(
    _COMMON
    | {"input", "instructions", "max_output_tokens", "text", "parallel_tool_calls", "reasoning"}
)
# Each API's token limit fields: capped at the operator's ceiling, and set
# to it when the client sends none (the upstream's default may be no limit).
TOKEN_FIELDS = {
    "/v1/chat/completions": ("max_tokens", "max_completion_tokens"),
    "/v1/responses": ("max_output_tokens",),
}
RETRY_AFTER_S = "1"


@dataclass(frozen=True)
class ProxyLimits:
    max_body_bytes: int
    max_tokens: int
    max_concurrent: int


def bounded_body(
    path: str, body: dict[str, Any], max_tokens: int, host: str = ""
) -> dict[str, Any]:
    """The body within the proxy's limits, or ValueError naming what is not
    allowed. A token limit over the ceiling is lowered to it; with none,
    the ceiling is set in the field the upstream takes (OpenAI's reasoning
    models refuse ``max_tokens``)."""
    allowed = CHAT_FIELDS if path == "/v1/chat/completions" else RESPONSES_FIELDS
    refused = sorted(set(body) - allowed)
    if refused:
        raise ValueError(f"fields not accepted by this proxy: {', '.join(refused[:5])}")
    bounded = dict(body)
    fields = TOKEN_FIELDS[path]
    for field in fields:
        value = bounded.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ValueError(f"{field} must be an integer")
        if value is not None:
            bounded[field] = max(1, min(value, max_tokens))
    if all(bounded.get(field) is None for field in fields):
        openai = path == "/v1/chat/completions" and host.endswith("api.openai.com")
        bounded[fields[1] if openai else fields[0]] = max_tokens
    return bounded


# What an upstream refusal becomes for the client: its status where it
# speaks of the client's request, else a 502 (an upstream 401 means the
# service's own key is wrong, not the client's).
_CLIENT_STATUSES = {400: "upstream_refused", 413: "upstream_refused", 422: "upstream_refused"}
MAX_LOGGED_ERROR_CHARS = 2000


async def _upstream_refused(upstream: aiohttp.ClientResponse, url: str) -> web.Response:
    """A generic answer for an upstream error: its body (the provider's
    message, which can name internal hosts or quote a masked key) goes to
    the log only."""
    try:
        text = (await upstream.text(errors="replace"))[:MAX_LOGGED_ERROR_CHARS]
    except (aiohttp.ClientError, TimeoutError) as exc:
        text = f"(body unreadable: {exc!r})"
    finally:
        upstream.close()
    status = upstream.status
    log.warning("llm proxy: upstream refused", extra={"url": url, "status": status, "body": text})
    message = f"the LLM endpoint answered {status}; the server's log has its reason"
    if status == 429:
        response = error_response(429, "upstream_busy", message)
        response.headers["Retry-After"] = RETRY_AFTER_S
        return response
    code = _CLIENT_STATUSES.get(status)
    return error_response(status if code else 502, code or "upstream_error", message)


async def _read_body(request: web.Request, limit: int) -> dict[str, Any]:
    if request.content_length is not None and request.content_length > limit:
        raise ValueError(f"body larger than {limit} bytes")
    raw = await request.content.read(limit + 1)
    if len(raw) > limit:
        raise ValueError(f"body larger than {limit} bytes")
    try:
        body = strict_json.loads(raw)
    except strict_json.JsonRefused as exc:
        raise ValueError(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("body must be a JSON object")
    return body


def add_llm_proxy(
    app: web.Application,
    endpoint: Callable[[], HttpLlmConfig | None],
    limits: ProxyLimits,
    refusal: Callable[[web.Request], web.Response | None],
) -> None:
    """Add the proxy routes; ``endpoint`` gives the LLM once the engine has
    started, ``refusal`` answers requests without a valid API key."""
    # One connection pool, made inside the running loop (the app is frozen by then).
    pool: list[aiohttp.ClientSession] = []
    in_flight = [0]

    @checks_its_own_caller
    async def forward(request: web.Request) -> web.StreamResponse:
        if (refused := refusal(request)) is not None:
            return refused
        config = endpoint()
        if config is None:
            return error_response(503, "not_ready", "the LLM is still starting")
        if in_flight[0] >= limits.max_concurrent:
            response = error_response(
                429, "too_many_requests", f"{limits.max_concurrent} proxy requests already run"
            )
            response.headers["Retry-After"] = RETRY_AFTER_S
            return response
        in_flight[0] += 1
        try:
            return await _forward(request, config)
        finally:
            in_flight[0] -= 1

    async def _forward(request: web.Request, config: HttpLlmConfig) -> web.StreamResponse:
        try:
            body = await _read_body(request, limits.max_body_bytes)
            host = urlparse(config.base_url).hostname or ""
            body = bounded_body(request.path, body, limits.max_tokens, host)
        except ValueError as exc:
            status = 413 if "larger" in str(exc) else 400
            return error_response(
                status, "body_too_large" if status == 413 else "invalid_body", str(exc)
            )
        body["model"] = config.model
        headers = {"Content-Type": "application/json"}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        url = config.base_url.rstrip("/") + PATHS[request.path]
        timeout = aiohttp.ClientTimeout(
            total=config.total_timeout_s,
            sock_connect=config.connect_timeout_s,
            sock_read=max(config.first_token_timeout_s, config.read_timeout_s),
        )
        try:
            if not pool:  # made on first use, inside the loop, knowing the endpoint
                connector = aiohttp.TCPConnector(force_close=not config.keep_alive)
                pool.append(aiohttp.ClientSession(connector=connector))
            upstream = await pool[0].post(url, json=body, headers=headers, timeout=timeout)
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning("llm proxy: upstream failed", extra={"url": url, "error": repr(exc)})
            return error_response(
                502, "upstream_unreachable", "the LLM endpoint could not be reached"
            )
        if upstream.status >= 400:
            return await _upstream_refused(upstream, url)
        try:
            response = web.StreamResponse(
                status=upstream.status,
                headers={"Content-Type": upstream.headers.get("Content-Type", "application/json")},
            )
            await response.prepare(request)
            try:
                async for chunk in upstream.content.iter_any():
                    await response.write(chunk)
            except (aiohttp.ClientError, TimeoutError) as exc:
                # Headers are gone already: all that is left is to end the stream.
                log.warning("llm proxy: upstream broke off", extra={"error": repr(exc)})
                return response
            await response.write_eof()
            return response
        finally:
            upstream.close()  # the client left, or we are done: stop upstream work

    async def http_session(app: web.Application) -> AsyncIterator[None]:
        yield
        if pool:
            await pool.pop().close()

    app.cleanup_ctx.append(http_session)
    for path in PATHS:
        app.router.add_post(path, forward)
