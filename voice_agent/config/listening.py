"""Settings of listening: voice activity detection, turn detection and the
end of turn, barge-in.
One section of ``Settings`` (voice_agent/config/settings.py)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class ListeningSettings(BaseModel):
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
    turn_words: bool = Field(
        True,
        description="Semantic turns: the embedded LLM reads the words of a pause the model "
        "judged incomplete (how likely a sentence ends there); a whole sentence ends the "
        "turn after a split cap (1200 ms at medium eagerness) rather than the cap. Only with the "
        "embedded LLM on its packaged model (no --llm-base-url, --llama-model-path or "
        "--llama-server-command).",
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
    barge_in_onset_ms: int = Field(
        60,
        ge=20,
        le=2000,
        description="Speech over a reply this long pauses it, before the turn starts "
        "(--speech-start-ms); a sound that stops sooner lifts the pause a frame later. As long "
        "as --speech-start-ms: the pause waits for the turn (lines whose echo leaks in bursts).",
    )
    vad_floor_dbfs: float = Field(
        -50.0, le=0, description="Frames quieter than this are silence, whatever the VAD says."
    )
    speech_start_ms: int = Field(
        100, ge=20, le=2000, description="Speech needed before a turn (and barge-in) starts."
    )
    preroll_ms: int = Field(300, ge=0, le=2000, description="Audio kept from before speech onset.")
    max_turn_s: float = Field(30.0, gt=1, description="Longest user turn before it is cut.")
