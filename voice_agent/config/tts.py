"""Settings of speaking: the TTS, its voices, and the outbound audio.
One section of ``Settings`` (voice_agent/config/settings.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from voice_agent.cpu import default_threads


class TtsSettings(BaseModel):
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
