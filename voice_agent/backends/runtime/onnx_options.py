"""ONNX Runtime session options shared by the backends that run on it."""

from __future__ import annotations

import platform
import tempfile
from pathlib import Path

import onnxruntime

from voice_agent.cpu import cpu_flags

# ONNX Runtime's switch to exact 8-bit products on x86
# (kOrtSessionOptionsAvx2PrecisionMode): it stores signed weights as
# unsigned and multiplies them on the unsigned-by-unsigned kernel.
X64_QUANT_PRECISION = "session.x64quantprecision"
# Flags whose kernels sum 8-bit products in 32 bits (VNNI, AMX): there the
# signed-weight kernel is exact already, and the option would only move the
# products off it onto the slower AVX2 one.
EXACT_INT8_FLAGS = frozenset({"avx512_vnni", "avx_vnni", "amx_int8"})


def saturating_int8(flags: frozenset[str], machine: str) -> bool:
    """Whether ONNX Runtime's default 8-bit kernel saturates on this CPU:
    x86 without VNNI or AMX (or flags unknown: the exact kernel is then the
    safe choice)."""
    if machine.lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return False
    return not flags & EXACT_INT8_FLAGS


SATURATING_INT8 = saturating_int8(cpu_flags(), platform.machine())


def quiet_session_options(threads: int) -> onnxruntime.SessionOptions:
    """``threads`` compute threads that sleep when idle, and no memory
    pattern kept per input shape.

    - Spinning idle threads would hold the cores the next stage needs (the
      LLM right after a transcript, the LLM and STT beside Piper).
    - ONNX Runtime keeps a memory pattern (and its pre-planned arena blocks)
      for every input shape it has seen, without a bound. Sentences and
      decoding steps are new shapes all the time. Turning it off is ONNX
      Runtime's advice for inputs whose shapes vary, and it is no slower here.
    - Exact 8-bit products on x86 CPUs without VNNI or AMX (AVX2 alone, or
      AVX-512 without VNNI): there ONNX Runtime's fast kernel for unsigned
      activations times signed weights adds pairs of products in 16 bits,
      which saturate. Without the exact kernel Whisper's encoder states are
      0.09-0.10 off CTranslate2's float ones (relative) instead of
      0.03-0.05, a read sentence is transcribed twice, silence becomes
      words, and Smart Turn's verdicts move by up to 0.9 (bench/RESULTS.md).
      The exact kernel costs ~6 % of a Smart Turn judgement there. CPUs with
      VNNI or AMX keep their own kernel, which is exact.
    """
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "0")
    options.enable_mem_pattern = False
    if SATURATING_INT8:
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


def rewritten(model: bytes) -> bytes:
    """``model`` with ONNX Runtime's graph rewrites that hold on any CPU
    (constant folding, fusions: ``ORT_ENABLE_EXTENDED``) applied, for a
    cache of derived graphs: a session made from it has less left to do, and
    its outputs are the same bit for bit. They are a session's slowest
    set-up step on large graphs (Piper's encoder half: 0.57 s to a session,
    0.30 s rewritten). The rewrites beyond (ORT_ENABLE_ALL's layouts) are
    CPU-specific, so each session still makes those, and so are the
    session options that choose kernels: the exact 8-bit products above
    store the weights unsigned, so the rewrite is made without them, and a
    session that needs them converts the weights itself. The graph is only
    valid with this ONNX Runtime version and this rewrite: both belong in
    its key (``VERSION``)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    with tempfile.TemporaryDirectory(prefix="voice-agent-graph-") as folder:
        target = Path(folder) / "rewritten.onnx"
        options.optimized_model_filepath = str(target)
        cpu = ["CPUExecutionProvider"]
        onnxruntime.InferenceSession(model, sess_options=options, providers=cpu)
        return target.read_bytes()


# Raised when rewritten() writes something else: the caches' keys change.
REWRITE = 1
VERSION = f"onnxruntime {onnxruntime.__version__}, rewrite {REWRITE}"
