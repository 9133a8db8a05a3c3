"""ONNX Runtime session options shared by the backends that run on it."""

from __future__ import annotations

import onnxruntime

# ONNX Runtime's switch to the non-saturating 8-bit kernels on x86 without
# VNNI (kOrtSessionOptionsAvx2PrecisionMode).
X64_QUANT_PRECISION = "session.x64quantprecision"


def quiet_session_options(threads: int) -> onnxruntime.SessionOptions:
    """``threads`` compute threads that sleep when idle, and no memory
    pattern kept per input shape.

    - Spinning idle threads would hold the cores the next stage needs (the
      LLM right after a transcript, the LLM and STT beside Piper).
    - ONNX Runtime keeps a memory pattern (and its pre-planned arena blocks)
      for every input shape it has seen, without a bound. Sentences and
      decoding steps are new shapes all the time. Turning it off is ONNX
      Runtime's advice for inputs whose shapes vary, and it is no slower here.
    - Exact 8-bit products on x86 CPUs without VNNI (AVX2 alone, or AVX-512
      without VNNI): there ONNX Runtime's fast kernel for unsigned
      activations times signed weights adds pairs of products in 16 bits,
      which saturate. Whisper's encoder states then came 0.09-0.10 off
      (relative) instead of 0.03-0.05, its transcripts read a sentence
      twice or put words into silence, and Smart Turn's verdicts moved by
      up to 0.6. The precise kernel costs ~6 % of a judgement there; CPUs
      with VNNI (or AMX) never took the saturating path, so it changes
      nothing on them.
    """
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.enable_mem_pattern = False
    options.add_session_config_entry(X64_QUANT_PRECISION, "1")
    return options


def session_from_bytes(
    model: bytes, options: onnxruntime.SessionOptions
) -> onnxruntime.InferenceSession:
    """A CPU session of an in-memory model, without the copy of the model
    ONNX Runtime's Python wrapper keeps: it holds the bytes only to build
    the session again on a provider fallback or ``set_providers()``, which
    a CPU-only session never does, and they stay resident for its life
    (57 MB for Whisper's decoder graphs, 60 MB for Piper's two halves)."""
    session = onnxruntime.InferenceSession(
        model, sess_options=options, providers=["CPUExecutionProvider"]
    )
    if getattr(session, "_model_bytes", None) is not None:
        session._model_bytes = None
    return session
