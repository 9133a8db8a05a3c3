"""Model backends (VAD, STT, LLM, TTS), chosen by name through ``registry``.

Backends know nothing of sessions, HTTP or the event protocol: they turn
audio into text and text into audio, and they are shared by every session.
"""

import os

# CPU inference runtimes in this process (CTranslate2's OpenMP) spin their
# worker threads for a while after each job. On a small machine that
# spinning steals the cores the *next* stage needs (measured when the LLM ran
# in-process: its first token 100 ms alone, 400 ms right after a Whisper
# call). Passive waiting must be chosen before the OpenMP runtime starts,
# hence at import. The embedded llama-server, a child process, has its own
# setting (--llama-omp-wait, llama_server.child_environment); what the
# operator set, if anything, is kept here for it. The mark tells our default
# from an operator's in processes that inherit it (a media worker, a server
# started by a benchmark or a test that imported this package).
OMP_DEFAULT_MARK = "VOICE_AGENT_OMP_WAIT_POLICY_DEFAULTED"
OPERATOR_OMP_WAIT_POLICY: str | None = None
if "OMP_WAIT_POLICY" in os.environ and os.environ.get(OMP_DEFAULT_MARK) != "1":
    OPERATOR_OMP_WAIT_POLICY = os.environ["OMP_WAIT_POLICY"]
else:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    os.environ[OMP_DEFAULT_MARK] = "1"
