"""Structured logging: one JSON object per line (or plain text for humans)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

# Attributes every LogRecord has; anything else was passed through ``extra``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(time.time(), 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        base = f"{self.formatTime(record, '%H:%M:%S')} {record.levelname:<7} {record.name}: "
        extras = " ".join(
            f"{k}={v}"
            for k, v in vars(record).items()
            if k not in _STANDARD and not k.startswith("_")
        )
        text = base + record.getMessage() + (f" [{extras}]" if extras else "")
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class WorkerTag(logging.Filter):
    """Names the media worker (``--workers``) on each of its log lines: the
    front and its workers write to one stderr, and a line that cannot be
    traced to its process (a stalled event loop, say) helps nobody."""

    def __init__(self, worker: int) -> None:
        super().__init__()
        self.worker = worker

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "worker"):
            record.worker = self.worker
        return True


def configure(
    level: str, fmt: str, worker: int | None = None, stream: TextIO | None = None
) -> None:
    """Log lines to ``stream`` (stderr); a media worker passes its index."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    if worker is not None:
        handler.addFilter(WorkerTag(worker))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiortc/aioice log every packet at DEBUG and chatty state changes at INFO.
    for noisy in ("aioice", "aiortc", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
