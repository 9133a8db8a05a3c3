"""When this process's models last computed.

Some work is only worth doing on an idle machine: a transcript of the turn
so far at the first short pause (``--stt-idle-early-ms``) wins a caller tens of
milliseconds when nothing else runs, and under load is mostly wasted (the
caller speaks on) while it takes cores from other callers' replies. The
STT and TTS workers report their jobs here; a model that computed within
``QUIET_S`` counts as busy too, because the gaps between one reply's
pieces, and between a transcript and its reply's first piece, are where the
LLM generates on the same cores.

Touched only from the event loop's thread (the workers' start and end
callbacks run there).
"""

from __future__ import annotations

import math
import time

# Longer than the LLM's first token plus a first piece (150-300 ms here),
# and than the gap between a reply's pieces while it is generated.
QUIET_S = 0.5


class ModelActivity:
    def __init__(self) -> None:
        self._jobs = 0
        self._last_end = -math.inf

    def started(self) -> None:
        self._jobs += 1

    def ended(self) -> None:
        self._jobs = max(0, self._jobs - 1)
        self._last_end = time.monotonic()

    def idle(self, quiet_s: float = QUIET_S) -> bool:
        """No job runs, and none ended within ``quiet_s``."""
        return self._jobs == 0 and time.monotonic() - self._last_end >= quiet_s


# The STT and TTS models of this process (the model process with --workers).
MODELS = ModelActivity()
