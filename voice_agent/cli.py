"""``voice-agent serve``: every setting is also a flag, documented in --help."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Union, get_args, get_origin

from pydantic import ValidationError

from voice_agent import __version__
from voice_agent.config import Settings, load_settings

if TYPE_CHECKING:
    from voice_agent.server.front import FrontServer
    from voice_agent.server.single import SingleServer

log = logging.getLogger("voice_agent")


def _flag_type(annotation: Any) -> tuple[Any, list[str] | None]:
    """argparse type and choices for a settings field annotation."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        inner = [arg for arg in get_args(annotation) if arg is not type(None)]
        return _flag_type(inner[0])
    if origin is Literal:
        return str, [str(arg) for arg in get_args(annotation)]
    if origin is list:
        return str, None  # comma-separated, split by the settings model
    return annotation, None


def _show(default: Any) -> str:
    return ",".join(default) if isinstance(default, list) else str(default)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voice-agent", description=__doc__)
    parser.add_argument("--version", action="version", version=f"voice-agent {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser(
        "serve",
        help="run the voice agent server",
        description="Run the voice agent. Every option can also be set as an environment "
        "variable VOICE_AGENT_<NAME> or in a TOML/JSON file given with --config; flags win "
        "over the environment, which wins over the file.",
    )
    add_settings_arguments(serve)
    check = commands.add_parser(
        "check",
        help="load each configured backend and run one real inference through it",
        description="Self-check: load the VAD, STT, LLM and TTS that `serve` would use with "
        "the same options, run one real inference through each, and print a table with the "
        "time, the result and how to fix what failed. Exit code 1 if anything failed.",
    )
    add_settings_arguments(check)
    return parser


def add_settings_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=None, help="TOML or JSON settings file")
    for name, field in Settings.model_fields.items():
        flag = "--" + name.replace("_", "-")
        kind, choices = _flag_type(field.annotation)
        default = field.get_default(call_default_factory=True)
        # A description that already says how its default is chosen (from the
        # cores, say) gets the value this machine would use.
        label = "here" if "default" in (field.description or "") else "default"
        help_text = field.description or ""
        if kind is bool:
            parser.add_argument(
                flag,
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=_literal(f"{help_text} ({label}: {default})"),
            )
            continue
        parser.add_argument(
            flag,
            dest=name,
            type=kind,
            choices=choices,
            default=None,
            metavar=name.upper(),
            help=_literal(f"{help_text} ({label}: {_show(default)})"),
        )


def _literal(help_text: str) -> str:
    """argparse %-formats help ("%(default)s"): a description's own percent
    signs ("7 % slower") are text."""
    return help_text.replace("%", "%%")


async def serve(settings: Settings) -> None:
    """Serve until a signal: everything in this process (``--workers 0``),
    or the front, the models and N media workers.
    SIGTERM drains first (no new calls, live ones finish or hear the
    goodbye: ``server/drain.py``); SIGINT, or a second signal, stops now."""
    from voice_agent.server.worker_pool import media_workers

    workers = media_workers(settings)
    server: FrontServer | SingleServer
    # Only the chosen server's code: the front never loads the media stack
    # (aiortc, PyAV), which only the processes that handle calls need.
    if workers > 0:
        from voice_agent.server.front import FrontServer

        server = FrontServer(settings)
    else:
        from voice_agent.server.single import SingleServer

        server = SingleServer(settings)
    # /healthz answers while models load; /readyz and calls wait for them.
    await server.listen()
    log.info(
        "listening",
        extra={"url": f"http://{settings.host}:{settings.port}", "workers": workers},
    )
    loop = asyncio.get_running_loop()
    first_signal: asyncio.Future[signal.Signals] = loop.create_future()
    stop_now = asyncio.Event()

    def on_signal(sig: signal.Signals) -> None:
        if first_signal.done():
            stop_now.set()
        else:
            first_signal.set_result(sig)
            if sig != signal.SIGTERM:
                stop_now.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    try:
        loading = asyncio.create_task(server.start(), name="server-start")
        waits: set[asyncio.Future[Any]] = {loading, first_signal}
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if loading in done:
            loading.result()  # start-up errors end the process with their message
            await first_signal
            if not stop_now.is_set():
                await _drain_unless_stopped(server, stop_now)
        else:
            loading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loading
    finally:
        log.info("shutting down")
        await server.stop()


async def _drain_unless_stopped(
    server: SingleServer | FrontServer, stop_now: asyncio.Event
) -> None:
    log.info("draining: no new calls", extra={"timeout_s": server.settings.drain_timeout_s})
    draining = asyncio.create_task(server.drain(), name="drain")
    stopping = asyncio.create_task(stop_now.wait())
    await asyncio.wait({draining, stopping}, return_when=asyncio.FIRST_COMPLETED)
    for task in (draining, stopping):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def main(argv: list[str] | None = None) -> int:
    args = vars(build_parser().parse_args(argv))
    command = args.pop("command")
    config_file = args.pop("config")
    try:
        settings = load_settings(args, config_file)
    except (ValidationError, ValueError, OSError) as exc:
        sys.stderr.write(f"voice-agent: invalid settings: {exc}\n")
        return 2
    from voice_agent.logs import configure

    # The check's answer is its table: only warnings are logged unless asked.
    quiet = command == "check" and args.get("log_level") is None
    configure("WARNING" if quiet else settings.log_level, settings.log_format)
    if command == "check":
        from voice_agent.selfcheck import render, run_checks

        rows = asyncio.run(run_checks(settings))
        sys.stdout.write(render(rows))
        return 0 if all(row.ok or row.skipped for row in rows) else 1
    if command == "serve":
        try:
            asyncio.run(serve(settings))
        except Exception as exc:
            from voice_agent.backends.llm.llama_server import LlamaServerError
            from voice_agent.backends.registry import BackendUnavailable
            from voice_agent.backends.stt.whisper_weights import WeightsUnavailable
            from voice_agent.server.auth import AuthConfigError
            from voice_agent.session.tools import ToolLoadError

            if isinstance(
                exc,
                BackendUnavailable
                | LlamaServerError
                | WeightsUnavailable
                | ToolLoadError
                | AuthConfigError,
            ):
                log.error("cannot start: %s", exc)
                return 1
            raise
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
