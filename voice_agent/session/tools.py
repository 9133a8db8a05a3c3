"""Server-side tools: plain Python functions the model may call mid-turn.

``--tools my_pkg.tools`` imports a module; the tools are the names in its
``__all__`` if it has one, else every public function defined in the module
itself (not imported into it). Each function's JSON schema comes from its
type hints (str, int, float, bool, list[...], dict, Literal[...], optional
parameters) and its docstring (first paragraph: the description; Google
style ``Args:`` lines: the parameters'). Sync functions run in a worker
thread, coroutines are awaited; every call has a timeout, and a failure
becomes an error text the model reads instead of a crash.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import importlib
import inspect
import json
import logging
import re
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from voice_agent.backends.base import ToolCall, ToolSpec

log = logging.getLogger(__name__)

MAX_RESULT_CHARS = 4000
# Threads for sync tools. Their own pool, not the loop's default one: that
# also resolves hostnames for aiohttp, and a stuck tool must not block the
# LLM's DNS lookups. A thread outlives a timed-out call, so a full pool
# refuses new calls rather than queue them behind stuck ones.
MAX_TOOL_THREADS = 8
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


class ToolLoadError(RuntimeError):
    """A tools module that cannot be used; the message says why."""


def _json_type(annotation: Any) -> dict[str, Any]:
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return _json_type(inner[0]) if len(inner) == 1 else {}
    if origin is Literal:
        values = list(get_args(annotation))
        return {"type": _json_type(type(values[0]))["type"], "enum": values}
    if origin in (list, tuple, set, Sequence):
        args = get_args(annotation)
        return {"type": "array", "items": _json_type(args[0]) if args else {}}
    if origin is dict or annotation is dict:
        return {"type": "object"}
    simple = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array"}
    if annotation in simple:
        return {"type": simple[annotation]}
    return {}


def _docstring_parts(func: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    doc = inspect.getdoc(func) or ""
    description = doc.split("\n\n", 1)[0].replace("\n", " ").strip()
    params: dict[str, str] = {}
    in_args = False
    for line in doc.splitlines():
        if line.strip() in ("Args:", "Arguments:", "Parameters:"):
            in_args = True
            continue
        if in_args:
            match = _ARG_LINE.match(line)
            if match is not None:
                params[match.group(1)] = match.group(2).strip()
            elif line.strip() and not line.startswith(" "):
                in_args = False
    return description, params


def tool_spec(func: Callable[..., Any]) -> ToolSpec:
    """The JSON schema the model sees for ``func``."""
    hints = get_type_hints(func)
    description, param_docs = _docstring_parts(func)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        schema = _json_type(hints.get(name, Any))
        if name in param_docs:
            schema["description"] = param_docs[name]
        properties[name] = schema
        if param.default is inspect.Parameter.empty:
            required.append(name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return ToolSpec(func.__name__, description or func.__name__, parameters)


class ToolRegistry:
    def __init__(
        self,
        functions: Sequence[Callable[..., Any]],
        timeout_s: float,
        max_threads: int = MAX_TOOL_THREADS,
    ) -> None:
        self.timeout_s = timeout_s
        self.max_threads = max_threads
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_threads, thread_name_prefix="tool"
        )
        self._busy = 0  # threads running a call, timed out or not
        self._busy_lock = threading.Lock()
        self._functions = {f.__name__: f for f in functions}
        self.specs = [tool_spec(f) for f in functions]

    @classmethod
    def from_module(cls, module_name: str, timeout_s: float) -> ToolRegistry:
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ToolLoadError(f"cannot import tools module {module_name!r}: {exc}") from None
        exported = getattr(module, "__all__", None)
        if exported is not None:
            functions = [getattr(module, name) for name in exported]
        else:
            functions = [
                value
                for name, value in vars(module).items()
                if inspect.isfunction(value)
                and not name.startswith("_")
                and value.__module__ == module.__name__
            ]
        if not functions or not all(callable(f) for f in functions):
            raise ToolLoadError(f"tools module {module_name!r} exports no functions")
        try:
            return cls(functions, timeout_s)
        except (NameError, TypeError) as exc:
            raise ToolLoadError(f"tools in {module_name!r} have unusable hints: {exc}") from None

    def __contains__(self, name: str) -> bool:
        return name in self._functions

    async def call(self, call: ToolCall) -> str:
        """Run one call; the result (or what went wrong) as text for the model."""
        func = self._functions.get(call.name)
        if func is None:
            return f"error: there is no tool named {call.name!r}"
        try:
            arguments = json.loads(call.arguments or "{}")
            if not isinstance(arguments, dict):
                raise ValueError("arguments must be a JSON object")
            inspect.signature(func).bind(**arguments)
        except (ValueError, TypeError) as exc:
            return f"error: invalid arguments for {call.name}: {exc}"
        try:
            async with asyncio.timeout(self.timeout_s):
                if inspect.iscoroutinefunction(func):
                    result = await func(**arguments)
                else:
                    # A thread cannot be stopped: on timeout the model is told
                    # and moves on while the function finishes in the background.
                    result = await self._in_thread(functools.partial(func, **arguments))
        except _PoolFull:
            log.warning("tool threads all busy", extra={"tool": call.name})
            return (
                f"error: {call.name} was not run: {self.max_threads} earlier tool calls "
                "are still running; try again later"
            )
        except TimeoutError:
            log.warning("tool timed out", extra={"tool": call.name, "timeout_s": self.timeout_s})
            return f"error: {call.name} did not finish within {self.timeout_s} s"
        except Exception as exc:
            log.warning("tool failed", exc_info=True, extra={"tool": call.name})
            return f"error: {call.name} failed: {type(exc).__name__}: {exc}"
        text = result if isinstance(result, str) else json.dumps(result, default=str)
        return text[:MAX_RESULT_CHARS]

    async def _in_thread(self, func: Callable[[], Any]) -> Any:
        with self._busy_lock:
            if self._busy >= self.max_threads:
                raise _PoolFull
            self._busy += 1
        future = self._executor.submit(func)
        future.add_done_callback(self._thread_done)
        return await asyncio.wrap_future(future)

    def _thread_done(self, future: concurrent.futures.Future[Any]) -> None:
        with self._busy_lock:
            self._busy -= 1


class _PoolFull(Exception):
    """Every tool thread is busy."""
