"""Audio placed by stream position, read back by stream position.

An echo canceller needs what was played and what came back lined up sample
for sample, the way a sound card's loudspeaker and microphone share one
clock. Over a network each direction arrives in its own rhythm (jitter
buffers release packets in bursts), so the two are lined up by their
*stream positions* (RTP timestamps, in samples), never by when a packet
happened to be handled: the offset between the two positions is fixed once
and stays put, whatever the jitter.

``AudioTimeline`` is the far-end history: a bounded ring indexed by stream
position. Positions never written (silence that was not sent, or audio
older than the ring) read as zeros.
"""

from __future__ import annotations

import numpy as np


class AudioTimeline:
    def __init__(self, samples: int) -> None:
        self._ring = np.zeros(samples, dtype=np.int16)
        self._head: int | None = None  # one past the last position written

    def write(self, position: int, samples: np.ndarray) -> None:
        """``samples`` starting at stream ``position``."""
        size = len(self._ring)
        if self._head is not None and self._head < position:
            # Unsent positions between writes are silence.
            gap = min(position - self._head, size)
            self._place(position - gap, np.zeros(gap, dtype=np.int16))
        if len(samples) > size:  # only the newest part fits
            position, samples = position + len(samples) - size, samples[-size:]
        self._place(position, samples)
        end = position + len(samples)
        self._head = end if self._head is None else max(self._head, end)

    def read(self, position: int, count: int) -> np.ndarray:
        """The ``count`` samples from stream ``position`` on."""
        positions = position + np.arange(count)
        chunk = self._ring[positions % len(self._ring)]
        if self._head is None:
            return np.zeros(count, dtype=np.int16)
        chunk[(positions >= self._head) | (positions < self._head - len(self._ring))] = 0
        return chunk

    def _place(self, position: int, samples: np.ndarray) -> None:
        self._ring[(position + np.arange(len(samples))) % len(self._ring)] = samples
