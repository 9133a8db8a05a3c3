"""How many calls this host carries, from a turn's measured CPU cost.

A call costs CPU in two ways: steadily while it is up (packets received
and decoded, the VAD, the agent's audio paced and encoded: IDLE_CALL_CORES)
and in a burst at each turn: the caller's words transcribed, the reply's
tokens (when the LLM runs here), the reply spoken. The burst is most of
it, and it differs between hosts and configurations by several times: a
remote LLM takes most of it away, Parakeet on CPU adds to it. A fixed
number of calls a core is right for one of them only.

So once its models are warm, the service runs one turn's work through them
and counts the CPU seconds it took, in this process and in the llama.cpp
server: the bundled phrase transcribed, a reply of up to REPLY_TOKENS
generated (by the embedded LLM only: a remote one's CPU is not this host's,
and it would bill the request), a reply of as many words spoken. It does so twice and
keeps the second, as the first pays for lazy set-up. The capacity is the
number of calls whose steady cost, plus one such turn every TURN_PERIOD_S,
fill UTILISATION of the available cores.

The measurement is cached on disk, keyed by what it depends on (the
models and their settings, the CPU, the cores, this version), so a restart
costs nothing; ``--max-calls`` replaces the whole estimate.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from voice_agent import __version__
from voice_agent.backends.base import ChatMessage, LlmBackend, SttBackend, TtsBackend, synthesize
from voice_agent.backends.stt.whisper_weights import cache_root
from voice_agent.config import Settings
from voice_agent.cpu import available_cores, default_max_calls

log = logging.getLogger(__name__)

PHRASE = Path(__file__).parent / "data" / "phrase-go-forward.raw"  # 16 kHz int16, 2.3 s
REPLY_TOKENS = 48  # a spoken reply's two sentences
REPLY_PROMPT = "In two short sentences, what can a voice assistant help me with?"
# The reply spoken, whoever wrote the reply: the same words on every host
# and with every LLM, about as long as REPLY_TOKENS make (38 words).
SPOKEN_REPLY = (
    "I can answer your questions, look things up, keep notes and set reminders "
    "for you. Just tell me what you need in a few words, and I will take care of "
    "it while we talk, step by step."
)
# One idle call's steady CPU, in cores: bench/idle.py, 1.5-1.8 % of a core
# (2026-12-03, AMD EPYC; the aiortc answerer alone 4.3 %).
IDLE_CALL_CORES = 0.018
# How often a caller takes a turn: a sentence said and a reply of two heard.
TURN_PERIOD_S = 10.0
# The share of the cores those turns' cost, one after another, may take.
# Under load the models batch (llama-server decodes its slots together,
# Whisper hears like turns in one pass), so a turn costs less than alone;
# and latency grows before the cores are full. Set, with TURN_PERIOD_S, so
# that the 2-core Intel Xeon these figures come from gets the 5 calls
# bench/load.py measured it to carry (0 failed turns, p95 1.3-2.1 s) from
# the 2.4-2.5 CPU-s it measures a turn at (5 for anything from 2.33 to
# 2.82; bench/RESULTS.md, "Capacity"). What the measurement adds is the
# ratio between hosts and configurations.
UTILISATION = 0.75
CACHE_FOLDER = "capacity"


@dataclass(frozen=True)
class TurnCost:
    """CPU seconds one turn's work took, by stage, on this host."""

    stt_s: float
    llm_s: float
    tts_s: float

    @property
    def total_s(self) -> float:
        return self.stt_s + self.llm_s + self.tts_s


def calls_for(cost: TurnCost, cores: int) -> int:
    """The calls ``cores`` carry at one ``cost`` turn a TURN_PERIOD_S each."""
    per_call = IDLE_CALL_CORES + cost.total_s / TURN_PERIOD_S
    return max(1, math.floor(cores * UTILISATION / per_call))


def process_cpu_s(pid: int) -> float | None:
    """CPU seconds (user and system) another process has used; None when it
    cannot be read (gone, not Linux)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # Fields 14 and 15 of stat(5), counted after the ")" that ends the name.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuClock:
    """CPU seconds of this process (all its threads) and of ``others``."""

    def __init__(self, others: list[int]) -> None:
        self._others = others

    def now(self) -> float:
        total = time.process_time()
        for pid in self._others:
            total += process_cpu_s(pid) or 0.0
        return total


def cache_key(settings: Settings, embedded_llm: bool) -> str:
    """What the measurement depends on: the models and their settings, the
    CPU, the cores this process may use, the version."""
    s = settings
    inputs = {
        "version": __version__,
        "cpu": _cpu_model(),
        "cores": available_cores(),
        "stt": [s.stt, s.stt_model, s.stt_threads, s.stt_window],
        "tts": [s.tts, s.tts_voice, s.tts_threads],
        "llm": (
            [s.llama_model_path, s.llama_weights, s.llama_threads, s.llama_kv_type, s.llm_model]
            if embedded_llm
            else []
        ),
        "method": [REPLY_TOKENS, REPLY_PROMPT, SPOKEN_REPLY],
    }
    blob = json.dumps(inputs, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


async def measure_turn_cost(
    stt: SttBackend, tts: TtsBackend, llm: LlmBackend | None, clock: CpuClock
) -> TurnCost:
    """One turn's work, twice; the second's CPU seconds by stage."""
    phrase = np.fromfile(PHRASE, dtype="<i2").astype(np.int16)
    cost = TurnCost(0.0, 0.0, 0.0)
    for _ in range(2):
        start = clock.now()
        await stt.transcribe(phrase)
        heard = clock.now()
        if llm is not None:
            prompt = [ChatMessage("user", REPLY_PROMPT)]
            async for _ in llm.stream_reply(prompt, REPLY_TOKENS, 0.0):
                pass  # its tokens' cost is what counts, not its words
        answered = clock.now()
        await synthesize(tts, SPOKEN_REPLY)
        llm_s = answered - heard if llm is not None else 0.0
        cost = TurnCost(heard - start, llm_s, clock.now() - answered)
    return cost


def turn_cost_figures(cost: TurnCost | None) -> dict[str, float] | None:
    """For ``/v1/stats``: the measured turn's CPU seconds, by stage and in
    all (None: --max-calls was given, or nothing could be measured)."""
    if cost is None:
        return None
    return {**{k: round(v, 3) for k, v in asdict(cost).items()}, "total_s": round(cost.total_s, 3)}


def capacity_of(max_calls: int | None, cost: TurnCost | None) -> int:
    """``--max-calls`` when given, else the calls ``cost`` allows on the
    available cores, else (nothing measured) the fixed number a core."""
    if max_calls is not None:
        return max_calls
    if cost is not None:
        return calls_for(cost, available_cores())
    return default_max_calls()


async def host_turn_cost(
    settings: Settings,
    stt: SttBackend,
    tts: TtsBackend,
    llm: LlmBackend | None,
    llama_pid: int | None,
) -> TurnCost | None:
    """The turn's cost on this host (cached), logged with the capacity it
    makes; None, logged, when it cannot be measured."""
    try:
        cost = await measured_turn_cost(
            settings, stt, tts, llm, CpuClock([llama_pid] if llama_pid else [])
        )
    except Exception:
        log.exception("turn cost not measured; the fixed capacity applies")
        return None
    log.info(
        "capacity",
        extra={
            "max_calls": capacity_of(None, cost),
            "cores": available_cores(),
            "turn_cpu_s": round(cost.total_s, 3),
            **{name: round(value, 3) for name, value in asdict(cost).items()},
        },
    )
    return cost


async def measured_turn_cost(
    settings: Settings,
    stt: SttBackend,
    tts: TtsBackend,
    llm: LlmBackend | None,
    clock: CpuClock,
    cache: Path | None = None,
) -> TurnCost:
    """The turn's cost from the cache, or measured now and cached."""
    folder = (cache or cache_root()) / CACHE_FOLDER
    path = folder / f"{cache_key(settings, llm is not None)}.json"
    try:
        return TurnCost(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        pass  # none yet, or unreadable: measure it
    started = time.perf_counter()
    cost = await measure_turn_cost(stt, tts, llm, clock)
    log.info(
        "turn cost measured",
        extra={**asdict(cost), "seconds": round(time.perf_counter() - started, 2)},
    )
    try:
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(asdict(cost)))
        partial.replace(path)  # whole or not at all, for a start-up beside this one
    except OSError as exc:  # a read-only home: measured again next time
        log.warning("turn cost not cached", extra={"path": str(path), "error": repr(exc)})
    return cost
