"""Settings of operations: logging, start-up, memory, debugging.
One section of ``Settings`` (voice_agent/config/settings.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class OperationsSettings(BaseModel):
    # --- operations ----------------------------------------------------
    log_level: str = Field("INFO", description="Logging level.")
    log_format: Literal["json", "text"] = Field("json", description="Log line format.")
    preload: bool = Field(True, description="Load every model before accepting calls.")
    loop_stall_ms: int = Field(
        100,
        ge=1,
        description="A callback that blocks the event loop longer than this is logged as a "
        "warning naming it, and counted in /v1/stats under loop.",
    )
    malloc_trim: bool = Field(
        True,
        description="After each call, give the C heap's free pages back to the kernel "
        "(glibc malloc_trim, in a thread, a few ms): without it, RSS keeps what calls freed.",
    )
    debug_endpoints: bool = Field(
        False,
        description="Serve /debug/memory and /debug/tracemalloc (live objects, tasks, heap): "
        "for soak tests only, each request walks every object on the event loop.",
    )
