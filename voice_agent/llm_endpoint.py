"""Where the service's LLM is: llama.cpp's server started here (the
embedded default), or a remote OpenAI-compatible endpoint, probed."""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from voice_agent.backends.llm.health import RemoteLlmProbe
from voice_agent.backends.llm.http_client import HttpLlmConfig
from voice_agent.backends.llm.llama_server import EmbeddedLlamaServer, default_model_path
from voice_agent.backends.llm.weights import weights_for
from voice_agent.config import Settings
from voice_agent.cpu import default_threads

log = logging.getLogger(__name__)


@dataclass
class LlmEndpoint:
    """The endpoint's client settings, and what runs or watches it: the
    embedded server (None: remote) or the remote one's health probe."""

    config: HttpLlmConfig
    llama: EmbeddedLlamaServer | None
    remote: RemoteLlmProbe | None


def embedded_server(s: Settings, model_path: Path) -> EmbeddedLlamaServer:
    """llama.cpp's server for ``model_path``, as the settings ask (not started)."""
    return EmbeddedLlamaServer(
        model_path,
        s.llama_threads,
        s.llama_ctx,
        # Prompts are one big batch, no per-token barrier to stall: every
        # core, as generation never gets more.
        batch_threads=s.llama_batch_threads or max(s.llama_threads, default_threads(8)),
        nice=s.inference_nice if s.llama_nice is None else s.llama_nice,
        poll=s.llama_poll,
        command=shlex.split(s.llama_server_command) if s.llama_server_command else None,
        binary=Path(s.llama_server_binary) if s.llama_server_binary else None,
        parallel=s.llama_parallel,
        cache_ram_mb=s.llama_cache_ram_mb,
        kv_type=s.llama_kv_type,
        verbose=s.llama_verbose,
        omp_wait=s.llama_omp_wait,
    )


async def open_llm_endpoint(s: Settings, model_name: str) -> LlmEndpoint:
    """The embedded server started (and proved) when no endpoint is
    configured; else the remote one, checked once (down is only a warning:
    it may come up later, and /readyz shows it)."""
    base_url = s.llm_base_url
    api_key = s.llm_api_key
    llama: EmbeddedLlamaServer | None = None
    remote: RemoteLlmProbe | None = None
    if base_url is not None and s.llm_model is None:
        log.warning(
            "no --llm-model given: the endpoint may refuse the default model name",
            extra={"model": model_name},
        )
    if base_url is not None and api_key is None:
        # The variables OpenAI's and Hugging Face's own clients read.
        api_key = os.environ.get("OPENAI_API_KEY") or os.environ.get("HF_TOKEN")
    if base_url is None:
        if s.llama_model_path:
            model_path = Path(s.llama_model_path)
        else:  # a conversion takes seconds, once: off the event loop
            model_path = await asyncio.to_thread(weights_for, default_model_path(), s.llama_weights)
        llama = embedded_server(s, model_path)
        try:
            await llama.start(supervise=False)
        except BaseException:
            # The caller never gets this server to stop: a child that came
            # up but failed its first request (or a start-up cancelled) must
            # not outlive the failure.
            await llama.stop()
            raise
        base_url = llama.base_url
    else:
        remote = RemoteLlmProbe(base_url, api_key)
        await remote.check()
    config = HttpLlmConfig(
        base_url=base_url,
        api_key=api_key,
        model=model_name,
        connect_timeout_s=s.llm_connect_timeout_s,
        first_token_timeout_s=s.llm_first_token_timeout_s,
        read_timeout_s=s.llm_read_timeout_s,
        total_timeout_s=s.llm_timeout_s,
        retries=s.llm_retries,
        reasoning_effort=s.llm_reasoning_effort,
        enable_thinking=s.llm_enable_thinking,
        keep_alive=llama is None,
    )
    return LlmEndpoint(config, llama, remote)
