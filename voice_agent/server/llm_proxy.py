"""The configured LLM, re-exposed for a client's side tasks (summaries,
titles, classification) at ``POST /v1/chat/completions`` and
``POST /v1/responses`` (``--enable-llm-proxy``, off by default).

Requests are forwarded as they are, except that ``model`` is replaced by the
server's model and the server's own key is used, so clients never see the
key. Replies (streamed or not) are passed through chunk by chunk. A client
that goes away ends the upstream request at once, also before the first
byte: the server runs with ``handler_cancellation``, so this handler is
cancelled and its ``finally`` closes the upstream connection.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from aiohttp import web

from voice_agent import strict_json
from voice_agent.backends.llm_http import HttpLlmConfig
from voice_agent.server.route_marks import checks_its_own_caller

log = logging.getLogger(__name__)

PATHS = {"/v1/chat/completions": "/chat/completions", "/v1/responses": "/responses"}


def _error(status: int, code: str, message: str) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return web.json_response(
        {"error": {"type": kind, "code": code, "message": message}}, status=status
    )


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
    max_body_bytes: int,
    refusal: Callable[[web.Request], web.Response | None],
) -> None:
    """Add the proxy routes; ``endpoint`` gives the LLM once the engine has
    started, ``refusal`` answers requests without a valid API key."""
    # One connection pool, made inside the running loop (the app is frozen by then).
    pool: list[aiohttp.ClientSession] = []

    @checks_its_own_caller
    async def forward(request: web.Request) -> web.StreamResponse:
        if (refused := refusal(request)) is not None:
            return refused
        config = endpoint()
        if config is None:
            return _error(503, "not_ready", "the LLM is still starting")
        try:
            body = await _read_body(request, max_body_bytes)
        except ValueError as exc:
            status = 413 if "larger" in str(exc) else 400
            return _error(status, "body_too_large" if status == 413 else "invalid_body", str(exc))
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
            return _error(502, "upstream_unreachable", f"the LLM endpoint failed: {exc!r}")
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
