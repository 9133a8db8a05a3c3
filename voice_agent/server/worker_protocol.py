"""What the front and a media worker say to each other
(``server/worker.py``, ``server/worker_pool.py``): the two lines a worker
reads on stdin, and where it streams its calls. Apart from the worker's
code, which loads the media stack the front never needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

EVENTS_PATH = "/internal/calls/events"


@dataclass(frozen=True)
class WorkerConfig:
    """The first line: this worker's index, its socket and the settings."""

    index: int
    socket: str
    settings: dict[str, Any]

    def call_id_prefix(self) -> str:
        return f"rtc_w{self.index}"


@dataclass(frozen=True)
class WorkerLinks:
    """The second line: the parent's models (``SharedModelLinks``' fields)
    and the capacity measured with them, each worker's own limit too."""

    links: dict[str, Any]
    max_calls: int
