"""A stand-in for the embedded llama.cpp server that crashes the way an
unfit build does: killed by SIGSEGV while answering a completion.

Run as ``voice-agent serve --llama-server-command`` (a real child process,
started, watched and restarted by the real supervisor):

    python tests/crashing_llm.py --port {port} [--crash-after N] [--crash-while PATH]

It prints start-up chatter, then the line the supervisor waits for. It
answers ``/v1/chat/completions`` (JSON or SSE) with a fixed reply, and dies
on the request after ``--crash-after`` good ones, or on every request while
the file ``--crash-while`` exists.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from aiohttp import web

REPLY = "Hello from the stand-in."


def crash() -> None:
    sys.stdout.write("ggml_backend_amx_mul_mat: about to fault\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGSEGV)


def build_app(crash_after: int | None, crash_while: Path | None) -> web.Application:
    served = 0

    async def completions(request: web.Request) -> web.StreamResponse:
        nonlocal served
        body = await request.json()
        if crash_after is not None and served >= crash_after:
            crash()
        if crash_while is not None and os.path.exists(crash_while):  # noqa: ASYNC240
            crash()
        served += 1
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": "chatcmpl-standin",
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": REPLY},
                            "finish_reason": "stop",
                        }
                    ],
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for piece in (REPLY, None):
            delta = {"content": piece} if piece else {}
            chunk = {
                "id": "chatcmpl-standin",
                "object": "chat.completion.chunk",
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": None if piece else "stop"}
                ],
            }
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def models(request: web.Request) -> web.StreamResponse:
        return web.json_response({"object": "list", "data": [{"id": "standin"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/v1/models", models)
    return app


async def serve(app: web.Application, host: str, port: int) -> None:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    # Like uvicorn: the line comes once the socket listens.
    sys.stdout.write(f"Uvicorn running on http://{host}:{port}\n")
    sys.stdout.flush()
    await asyncio.Event().wait()  # until the supervisor stops us


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--crash-after", type=int, default=None)
    parser.add_argument("--crash-while", type=Path, default=None)
    args = parser.parse_args()
    sys.stdout.write("system_info: n_threads = 2 | AVX2 = 1 | AMX_INT8 = 1\n")
    app = build_app(args.crash_after, args.crash_while)
    asyncio.run(serve(app, args.host, args.port))


if __name__ == "__main__":
    main()
