"""Settings of understanding: the STT model, its batching across sessions,
partial transcripts, a remote STT.
One section of ``Settings`` (voice_agent/config/settings.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from voice_agent.cpu import default_threads


class SttSettings(BaseModel):
    # --- understanding: STT ------------------------------------------------
    stt: str = Field("faster-whisper", description="Speech-to-text backend name.")
    stt_model: str = Field(
        "base",
        description="faster-whisper model: 'base' (embedded), 'tiny.en' (embedded) or a path; "
        "parakeet: a .nemo path or a cached pretrained name; openai: the remote model name.",
    )
    stt_language: str | None = Field("en", description="Spoken language (None = detect).")
    stt_threads: int = Field(
        default_factory=lambda: default_threads(4),
        ge=1,
        description="CPU threads for STT inference (default: the available cores, at most 4).",
    )
    stt_window: Literal["trim", "full"] = Field(
        "trim",
        description="Whisper encoder window: 'trim' (utterance + 1 s, ~4x faster) "
        "or 'full' (30 s).",
    )
    stt_decoder: Literal["onnx", "ctranslate2"] = Field(
        "onnx",
        description="faster-whisper: the runtime of Whisper's decoder. onnx: ONNX Runtime with "
        "8-bit weights, built from the same weights on the first start (about 1 s, then cached "
        "on disk), ~2.5x faster a token on CPU, the same greedy decoding; ctranslate2: "
        "CTranslate2's own.",
    )
    stt_encoder: Literal["onnx", "ctranslate2"] = Field(
        "onnx",
        description="faster-whisper: the runtime of Whisper's encoder. onnx: ONNX Runtime, int8 "
        "weights but for one float32 product a layer (built and cached as the decoder's); a "
        "transcript ~7 % slower than on CTranslate2 on 2 cores, and ~80 MB less memory, since "
        "CTranslate2 is then not loaded at all (with --stt-decoder onnx and no idle partial "
        "lane); ctranslate2: CTranslate2's own.",
    )
    stt_early_ms: int = Field(
        100,
        ge=40,
        description="Pause after which the turn so far is transcribed speculatively (and a "
        "reply prepared, held until the turn ends).",
    )

    # --- STT: batching, partial transcripts, remote STT ----------
    stt_device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Device for the parakeet STT backend (auto = CUDA when present)."
    )
    stt_parallel: int | None = Field(
        None,
        ge=1,
        le=256,
        description="Batches the one faster-whisper model runs at once, each with "
        "--stt-threads (default: the available cores / --stt-threads: 1 on 2 cores, 8 on 32).",
    )
    stt_max_batch: int = Field(
        8, ge=1, le=256, description="Most utterances one batched STT inference takes."
    )
    stt_batch_wait_ms: int = Field(
        0,
        ge=0,
        le=1000,
        description="Longest an utterance that finds the STT idle waits for others to batch "
        "with. 0: none; utterances that queue while a batch runs are still batched together.",
    )
    stt_partial_interval_ms: int | None = Field(
        None,
        ge=0,
        description="Transcribe speech in progress this often, sending transcription deltas "
        "(0 = off; default: the backend's, 500 for parakeet, off for faster-whisper and openai).",
    )
    stt_partial_lane: Literal["idle", "shared"] = Field(
        "shared",
        description="faster-whisper: where partial transcripts run. shared: on the one model, "
        "off unless --stt-partial-interval-ms, and then only when it is idle and finals and "
        "speculations kept it busy less than 30 % of the last 3 s. idle: on a "
        "second copy of the model (about 80 MB) whose threads run at the OS's idle priority "
        "(SCHED_IDLE), so partials take only CPU nothing else wants, on every 500 ms unless "
        "--stt-partial-interval-ms (their words prefill the LLM).",
    )
    stt_base_url: str | None = Field(
        None, description="Base URL of an OpenAI-compatible STT server (for --stt openai)."
    )
    stt_api_key: str | None = Field(
        None, description="API key for the remote STT server (default: env OPENAI_API_KEY)."
    )
    stt_timeout_s: float = Field(
        10.0,
        gt=0,
        description="Longest wait for a turn's transcript, any backend (a remote request, a "
        "hung model): past it the turn fails with an error and the apology.",
    )
    # Partials' compute budget: a final waits for at most one partial batch,
    # of at most this many utterances of at most this length.
    stt_partial_max_batch: int = Field(
        2, ge=1, le=256, description="Most partial transcripts one batched STT inference takes."
    )
    stt_partial_max_s: float = Field(
        8.0,
        gt=0,
        description="No partial transcripts once a turn is longer than this many seconds "
        "(its final transcript still covers all of it).",
    )
