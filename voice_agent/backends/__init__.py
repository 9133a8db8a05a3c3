"""Model backends (VAD, STT, LLM, TTS), chosen by name through ``registry``.

Backends know nothing of sessions, HTTP or the event protocol: they turn
audio into text and text into audio, and they are shared by every session.
"""

import os

# CPU inference runtimes (CTranslate2's and llama.cpp's OpenMP, ONNX Runtime)
# spin their worker threads for a while after each job. On a small machine
# that spinning steals the cores the *next* stage needs (measured here: LLM
# first token 100 ms alone, 400 ms right after a Whisper call). Passive
# waiting must be chosen before the OpenMP runtime starts, hence at import.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
