"""How an embedded LLM child process ended, and what its user should try."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChildExit:
    """How one llama.cpp child ended, and what it said last."""

    monotonic: float
    wall_time: float
    returncode: int
    during: str  # "start-up", "warm-up", "serving", "health check"
    output_tail: tuple[str, ...]

    @property
    def signal_name(self) -> str | None:
        if self.returncode >= 0:
            return None
        try:
            return signal.Signals(-self.returncode).name
        except ValueError:
            return f"signal {-self.returncode}"

    def describe(self) -> str:
        if self.signal_name is not None:
            return f"killed by {self.signal_name} (signal {-self.returncode})"
        return f"exited with code {self.returncode}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "at": round(self.wall_time, 3),
            "returncode": self.returncode,
            "signal": self.signal_name,
            "during": self.during,
            "output_tail": list(self.output_tail),
        }


REBUILD = (
    "rebuild llama-server with the portable default flags (rm -rf .cache/llama-server-* "
    "&& make run; see LLAMA_CMAKE_ARGS in the Makefile)"
)


def what_to_try(exit: ChildExit) -> str:
    """The advice for a user whose embedded LLM just died."""
    common = (
        "or point --llm-base-url at another OpenAI-compatible server; "
        "`voice-agent check` shows the build's CPU features"
    )
    if exit.signal_name == "SIGILL":
        return (
            "the llama.cpp build uses CPU instructions this machine lacks (a native build "
            "made elsewhere?): " + REBUILD + ", " + common
        )
    if exit.signal_name in ("SIGSEGV", "SIGBUS", "SIGABRT"):
        return (
            "a llama.cpp build that does not fit this CPU crashes like this (ggml's AMX path on "
            "Intel CPUs with AMX): " + REBUILD + " (never GGML_NATIVE=ON "
            "or GGML_AMX_*=ON on such a CPU), " + common
        )
    return "check the model file (--llama-model-path) and the output above, " + common
