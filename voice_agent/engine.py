"""Process-wide models: loaded once at start-up, shared by every session."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any

from voice_agent.backends import registry
from voice_agent.backends.base import (
    ChatMessage,
    LlmBackend,
    LlmError,
    TurnBackend,
    VadBackend,
    WordsBackend,
    synthesize,
)
from voice_agent.backends.capabilities import (
    PartialTranscriber,
    ReleasesMemory,
    WarmsUp,
)
from voice_agent.backends.llm.health import RemoteLlmProbe
from voice_agent.backends.llm.http_client import HttpLlmConfig
from voice_agent.backends.llm.llama_server import (
    MODEL_ALIAS,
    EmbeddedLlamaServer,
    LlamaServerError,
)
from voice_agent.backends.stt.hosted import HostedStt
from voice_agent.backends.tts.hosted import hosted as hosted_tts
from voice_agent.backends.turn.words import words_judge
from voice_agent.capacity import TurnCost, capacity_of, host_turn_cost
from voice_agent.config import Settings
from voice_agent.llm_endpoint import open_llm_endpoint
from voice_agent.memory import give_back_free_heap
from voice_agent.model_loading import (
    LocalModels,
    close_models,
    load_local_models,
    load_speech_models,
    prepare_process,
)
from voice_agent.session.endpointing import EAGERNESS, SERVER_EAGERNESS, JudgeStats
from voice_agent.session.hearing import HearingStats
from voice_agent.session.prefill import PrefillGate
from voice_agent.session.reply import ReplySettings
from voice_agent.session.session import Models, SessionConfig
from voice_agent.session.tools import ToolRegistry
from voice_agent.stages.turns import TurnConfig

log = logging.getLogger(__name__)


def turn_config(s: Settings) -> TurnConfig:
    """When a turn starts, pauses and ends, as the settings ask (every
    session of the service detects turns this way)."""
    return TurnConfig(
        speech_start_ms=s.speech_start_ms,
        turn_silence_ms=s.turn_silence_ms,
        early_ms=s.stt_early_ms,
        preroll_ms=s.preroll_ms,
        max_turn_s=s.max_turn_s,
        threshold=s.vad_threshold if s.vad == "silero" else 0.5,
    )


@dataclass(frozen=True)
class SharedModelLinks:
    """Where a media worker process (``--workers``) finds the models its
    parent holds: STT and TTS on the parent's speech socket, the LLM at its
    endpoint. JSON-ready, handed to the worker at start."""

    speech_socket: str
    llm: dict[str, Any]  # HttpLlmConfig's fields
    tts_sample_rate: int
    partial_interval_ms: int
    prefill: bool
    model_name: str
    voice_name: str
    # The model process's voices, the default first, and its TTS backend's name.
    tts_voices: tuple[str, ...] = ()
    tts_backend: str = "piper"
    words_url: str | None = None  # the embedded LLM, for the end-of-turn words judge


class Engine:
    def __init__(
        self,
        settings: Settings,
        links: SharedModelLinks | None = None,
        hosts_sessions: bool = True,
    ) -> None:
        """``hosts_sessions`` False: the models' process behind media workers
        (which hold the calls, and their own end-of-turn model)."""
        self.settings = settings
        self.links = links
        self.hosts_sessions = hosts_sessions
        self.models: Models | None = None
        self.llama: EmbeddedLlamaServer | None = None
        self.remote_llm: RemoteLlmProbe | None = None
        self._started = False
        self.model_name = links.model_name if links else settings.llm_model or MODEL_ALIAS
        self.llm_config: HttpLlmConfig | None = None  # the endpoint, once started
        self.tools: ToolRegistry | None = None
        self.prefill_gate = PrefillGate()  # this process's sessions' words prefills
        self.hearing = HearingStats()  # this process's redecoded and unheard turns
        self.end_of_turn = JudgeStats()  # this process's end-of-turn verdicts
        # One turn's work measured on this host (the models' process, when no
        # --max-calls is given), and the calls it makes the capacity.
        self.turn_cost: TurnCost | None = None

    @property
    def voice_name(self) -> str:
        """The default voice: the TTS's first."""
        if self.links is not None:
            return self.links.voice_name
        assert self.models is not None, "no voice before the models are loaded"
        return str(self.models.tts.voices()[0])

    def voice_catalog(self) -> list[dict[str, Any]]:
        """The voices a session may choose (``GET /v1/voices``)."""
        if self.models is None:
            return []
        backend = self.links.tts_backend if self.links is not None else self.models.tts.name
        return [
            {
                "name": name,
                "backend": backend,
                "default": index == 0,
                "sample_rate": self.models.tts.sample_rate,
            }
            for index, name in enumerate(self.models.tts.voices())
        ]

    @property
    def ready(self) -> bool:
        llama_ok = self.llama is None or self.llama.ready
        return self._started and llama_ok

    @property
    def unready_reason(self) -> str | None:
        """Why no call can be taken now, in one line; None when ready."""
        if not self._started:
            return "models are still loading"
        if self.llama is not None:
            return self.llama.unready_reason
        return None

    def llm_health(self) -> dict[str, Any] | None:
        """The LLM's state for /readyz and /v1/stats: the embedded server's
        deaths and restarts, or whether the remote endpoint answers."""
        if self.llama is not None:
            return self.llama.health()
        if self.remote_llm is not None:
            self.remote_llm.refresh_if_stale()
            return self.remote_llm.health()
        return None

    async def start(self, local: LocalModels | None = None) -> None:
        """Load (or take ``local``, loaded ahead) this process's models and,
        in the models' process, start the LLM; ready when it returns."""
        s = self.settings
        started = time.perf_counter()
        if s.tools is not None:
            self.tools = ToolRegistry.from_module(s.tools, s.tool_timeout_s)
            log.info("tools loaded", extra={"tools": [t.name for t in self.tools.specs]})
        if local is None:
            prepare_process(s)
            local = await load_local_models(s, self.hosts_sessions, warm=self.links is not None)
        vad, turn = local.vad, local.turn
        if self.links is not None:
            assert turn is not None
            words = await words_judge(self.links.words_url)
            self.models = self._linked_models(vad, turn, words, self.links)
            if s.malloc_trim:  # what loading read, joined and built, then freed
                await give_back_free_heap()
            self._started = True
            log.info("worker engine ready", extra={"speech": self.links.speech_socket})
            return
        # llama-server loads its weights in a process of its own: started
        # first, it comes up while the STT and TTS load here, not after them.
        starting_llm = asyncio.ensure_future(self.start_llm())
        try:
            stt, tts = await load_speech_models(s)
        except BaseException:
            # A server started meanwhile is stopped by stop() (self.llama);
            # one still starting stops itself when cancelled.
            starting_llm.cancel()
            try:
                await starting_llm
            except asyncio.CancelledError:
                pass
            except BaseException as exc:  # the models' failure is the one raised
                log.warning("the LLM failed to start too", extra={"error": repr(exc)})
            raise
        try:
            llm = await starting_llm
        except BaseException:
            await close_models(stt, tts)
            raise
        words = await words_judge(self._words_url() if turn is not None else None)
        self.models = Models(vad=vad, stt=stt, tts=tts, llm=llm, turn=turn, words=words)
        if s.preload:
            await self._warm_up()
        if s.max_calls is None:  # the capacity from what a turn costs here
            models, llama = self.models, self.llama
            self.turn_cost = await host_turn_cost(
                s,
                models.stt,
                models.tts,
                models.llm if llama is not None else None,
                llama.pid if llama is not None else None,
            )
        if self.llama is not None:
            self.llama.supervise()  # restarts from here on; a death before is fatal
        if isinstance(self.models.tts, ReleasesMemory):  # idle until the first call
            try:
                await self.models.tts.release_memory()
            except Exception as exc:  # only memory kept: never a reason not to start
                log.warning("tts memory not released", extra={"error": str(exc)})
        if s.malloc_trim:  # 130-170 MB of the model process at ready
            await give_back_free_heap()
        self._started = True
        log.info("engine ready", extra={"seconds": round(time.perf_counter() - started, 2)})

    def _linked_models(
        self,
        vad: VadBackend,
        turn: TurnBackend,
        words: WordsBackend | None,
        links: SharedModelLinks,
    ) -> Models:
        """A worker's models: its own VAD (per-frame, tiny), the rest shared."""
        s = self.settings
        self.llm_config = HttpLlmConfig(**links.llm)
        llm: LlmBackend = registry.create("llm", s.llm_backend, self.llm_config)
        return Models(
            words=words,
            vad=vad,
            stt=HostedStt(links.speech_socket, links.partial_interval_ms, s.stt_timeout_s),
            tts=hosted_tts(
                links.speech_socket,
                links.tts_sample_rate,
                s.tts_timeout_s,
                links.tts_voices or (links.voice_name,),
            ),
            llm=llm,
            turn=turn,
        )

    def links_for_workers(self, speech_socket: str) -> SharedModelLinks:
        """What a media worker needs to use this process's models."""
        assert self.models is not None and self.llm_config is not None
        return SharedModelLinks(
            speech_socket=speech_socket,
            llm=asdict(self.llm_config),
            tts_sample_rate=self.models.tts.sample_rate,
            partial_interval_ms=self._partial_interval_ms(),
            prefill=self.llm_prefill,
            model_name=self.model_name,
            voice_name=self.voice_name,
            tts_voices=tuple(self.models.tts.voices()),
            words_url=self._words_url(),
            tts_backend=self.models.tts.name,
        )

    async def start_llm(self) -> LlmBackend:
        """The LLM client, starting (and proving) the embedded server first
        when no endpoint is configured."""
        endpoint = await open_llm_endpoint(self.settings, self.model_name)
        self.llama, self.remote_llm = endpoint.llama, endpoint.remote
        self.llm_config = endpoint.config
        llm: LlmBackend = registry.create("llm", self.settings.llm_backend, endpoint.config)
        return llm

    async def _warm_up(self) -> None:
        """Run each model once so the first caller doesn't pay for lazy init."""
        assert self.models is not None
        if isinstance(self.models.stt, WarmsUp):  # not a remote one: it would be billed
            await self.models.stt.warm_up()
        if isinstance(self.models.turn, WarmsUp):
            await self.models.turn.warm_up()
        await synthesize(self.models.tts, "Hello.")
        if not self.llm_prefill:
            return  # a remote endpoint bills every request: it is warmed by real use
        # The first request to llama.cpp pays for its buffers (~0.3 s), and
        # llama.cpp reuses the longest cached prompt prefix: priming it with the
        # system prompt saves ~0.2 s on every first turn. prefill() asks for
        # as few tokens as each API accepts (Responses: at least 16).
        try:
            await self.models.llm.prefill(
                [ChatMessage("system", self.settings.llm_instructions), ChatMessage("user", "Hi")],
                # Tool schemas are part of the prompt a chat template renders.
                self.tools.specs if self.tools is not None else (),
            )
        except LlmError as exc:
            died = await self.llama.exit_after_failure("warm-up") if self.llama else None
            if died is not None:  # every call would fail: refuse to start
                raise LlamaServerError(EmbeddedLlamaServer.startup_failure(died)) from None
            # A remote endpoint that is down now may be up for the first call;
            # until then each reply fails with an error event and an apology.
            log.warning("llm warm-up failed", extra={"code": exc.code, "error": str(exc)})

    @property
    def max_calls(self) -> int:
        """The service's capacity: --max-calls, else from the turn's cost
        measured here, else (not measured, or not yet) a fixed number a core."""
        return capacity_of(self.settings.max_calls, self.turn_cost)

    @property
    def llm_prefill(self) -> bool:
        """Prefill (and warm-up) requests: on by default only for the embedded server."""
        if self.links is not None:
            return self.links.prefill
        s = self.settings
        return s.llm_prefill if s.llm_prefill is not None else s.llm_base_url is None

    @property
    def llm_prefill_partials(self) -> bool:
        """Words prefills: by default wherever prefills are on, except with
        the Responses API (its prefill generates 16 tokens, each time)."""
        s = self.settings
        if not self.llm_prefill:
            return False
        if s.llm_prefill_partials is not None:
            return s.llm_prefill_partials
        return s.llm_backend == "chat-completions"

    def session_config(self) -> SessionConfig:
        s = self.settings
        return SessionConfig(
            instructions=s.llm_instructions,
            history_turns=s.llm_history_turns,
            turn=turn_config(s),
            reply=ReplySettings(
                max_tokens=s.llm_max_tokens,
                temperature=s.llm_temperature,
                max_tool_steps=s.max_tool_steps,
                apology=s.llm_apology,
                trim_lead=s.tts_trim_lead,
            ),
            vad_floor_dbfs=s.vad_floor_dbfs,
            prefill=self.llm_prefill,
            prefill_partials=self.llm_prefill_partials,
            prefill_gate=self.prefill_gate,
            tools=self.tools,
            partial_interval_ms=self._partial_interval_ms(),
            stt_timeout_s=s.stt_timeout_s,
            hearing_stats=self.hearing,
            clarification=s.stt_clarification,
            judge_ms=s.turn_judge_ms,
            judge_timeout_s=s.turn_judge_timeout_ms / 1000.0,
            judge_stats=self.end_of_turn,
            semantic=EAGERNESS[SERVER_EAGERNESS] if s.turn_detection == "semantic" else None,
            interrupt_min_ms=s.interrupt_min_ms,
            barge_in_onset_ms=s.barge_in_onset_ms,
        )

    def _words_url(self) -> str | None:
        """Where the end-of-turn words judge asks: the embedded LLM, whose
        llama.cpp server gives next-token probabilities (a remote endpoint
        may not, and would bill each pause)."""
        s = self.settings
        if not s.turn_words or self.llama is None or s.llama_server_command:
            return None
        if s.llama_model_path:  # the thresholds were set on the packaged model's answers
            return None
        return self.llama.base_url

    def _partial_interval_ms(self) -> int:
        """The setting, or else the STT backend's own default (0 = off)."""
        if self.settings.stt_partial_interval_ms is not None:
            return self.settings.stt_partial_interval_ms
        stt = self.models.stt if self.models is not None else None
        return stt.default_partial_interval_ms if isinstance(stt, PartialTranscriber) else 0

    async def stop(self) -> None:
        if self.models is not None:
            if self.models.turn is not None:
                self.models.turn.close()
            if self.models.words is not None:
                await self.models.words.close()
            await close_models(self.models.stt, self.models.tts)
            await self.models.llm.aclose()
        if self.llama is not None:
            await self.llama.stop()
        if self.remote_llm is not None:
            await self.remote_llm.aclose()
