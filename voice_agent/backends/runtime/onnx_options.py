"""ONNX Runtime session options shared by the backends that run on it."""

from __future__ import annotations

import onnxruntime


def quiet_session_options(threads: int) -> onnxruntime.SessionOptions:
    """``threads`` compute threads that sleep when idle, and no memory
    pattern kept per input shape.

    - Spinning idle threads would hold the cores the next stage needs (the
      LLM right after a transcript, the LLM and STT beside Piper).
    - ONNX Runtime keeps a memory pattern (and its pre-planned arena blocks)
      for every input shape it has seen, without a bound. Sentences and
      decoding steps are new shapes all the time. Turning it off is ONNX
      Runtime's advice for inputs whose shapes vary, and it is no slower here.
    """
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.enable_mem_pattern = False
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
