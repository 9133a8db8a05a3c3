"""An utterance longer than Whisper's 30 s window, cut into pieces it can
read one at a time, where no CTranslate2 model is loaded to seek through it
(whisper_batch.py transcribes the pieces in order and joins their words)."""

from __future__ import annotations

import numpy as np

# An utterance longer than the 30 s window, with no CTranslate2 model to
# seek through it, is cut into pieces of at most LONG_PIECE_S at its
# quietest 100 ms after LONG_PIECE_MIN_S (a pause, where there is one).
LONG_PIECE_S = 28.0
LONG_PIECE_MIN_S = 18.0


def long_pieces(samples: np.ndarray, rate: int = 16_000) -> list[np.ndarray]:
    """``samples`` cut into pieces of at most LONG_PIECE_S, each cut at the
    quietest 100 ms between LONG_PIECE_MIN_S and LONG_PIECE_S into its piece."""
    pieces: list[np.ndarray] = []
    hop = rate // 10
    while len(samples) > LONG_PIECE_S * rate:
        lo, hi = int(LONG_PIECE_MIN_S * rate) // hop, int(LONG_PIECE_S * rate) // hop
        frames = samples[lo * hop : hi * hop].astype(np.float32).reshape(-1, hop)
        quietest = lo + int(np.argmin(np.square(frames).mean(axis=1)))
        cut = quietest * hop + hop // 2
        pieces.append(samples[:cut])
        samples = samples[cut:]
    pieces.append(samples)
    return pieces
