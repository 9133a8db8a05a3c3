"""Loading a process's models at start-up: what must come first, the small
per-call models each process that holds calls loads for itself, and the
STT and TTS loaded side by side (engine.py starts them in this order)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from voice_agent.backends import registry
from voice_agent.backends.base import SttBackend, TtsBackend, TurnBackend, VadBackend
from voice_agent.backends.capabilities import ClosesAsync, WarmsUp
from voice_agent.config import Settings
from voice_agent.cpu import limit_blas_threads, run_in_inference_thread, set_inference_nice

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalModels:
    """The models each process that holds calls loads for itself, small and
    per frame or per pause: the VAD and the end-of-turn model (None in the
    models' process behind media workers, which holds no calls)."""

    vad: VadBackend
    turn: TurnBackend | None


def prepare_process(s: Settings) -> None:
    """What must precede any model load in this process: the inference
    niceness its model threads inherit, and the BLAS thread cap."""
    set_inference_nice(s.inference_nice)
    capped = limit_blas_threads(s.blas_threads)
    if capped:
        log.info("blas threads capped", extra={"threads": s.blas_threads, "libraries": capped})


async def load_local_models(s: Settings, hosts_sessions: bool, warm: bool) -> LocalModels:
    """The VAD and, where calls are held, the end-of-turn model, loaded off
    the event loop (and /healthz stays responsive); ``warm``: the turn model
    run once, so the first caller's pause does not pay its lazy set-up."""
    vad: VadBackend = await asyncio.to_thread(registry.create, "vad", s.vad, s)
    # Small (9 MB, ~50 ms a judgement): each process that holds calls has
    # its own, shared by its sessions, as with the VAD.
    turn: TurnBackend | None = None
    if hosts_sessions:
        turn = await asyncio.to_thread(registry.create, "turn", s.turn_backend, s)
        if warm and s.preload and isinstance(turn, WarmsUp):
            await turn.warm_up()
    return LocalModels(vad, turn)


async def close_models(*models: SttBackend | TtsBackend) -> None:
    for model in models:
        if isinstance(model, ClosesAsync):
            await model.aclose()
        else:
            model.close()


async def load_speech_models(s: Settings) -> tuple[SttBackend, TtsBackend]:
    """The STT and the TTS, loaded side by side (each is mostly ONNX
    Runtime's graph set-up, in C++), in niced threads: the compute threads
    a model creates inherit it. One that fails closes the other."""
    loads = await asyncio.gather(
        run_in_inference_thread(registry.create, "stt", s.stt, s),
        run_in_inference_thread(registry.create, "tts", s.tts, s),
        return_exceptions=True,
    )
    stt, tts = loads
    if isinstance(stt, BaseException) or isinstance(tts, BaseException):
        await close_models(*(m for m in loads if not isinstance(m, BaseException)))
        raise stt if isinstance(stt, BaseException) else tts
    return stt, tts
