"""Log records caught while a test runs."""

from __future__ import annotations

import asyncio
import logging
from types import TracebackType


class Logged(logging.Handler):
    """Records of ``level`` and above from ``logger`` (and its children)
    while attached; ``arrived`` is set by each (emitted on the loop thread)."""

    def __init__(self, logger: str = "", level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.logger = logging.getLogger(logger)
        self.records: list[logging.LogRecord] = []
        self.arrived = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self.arrived.set()

    def __enter__(self) -> Logged:
        self.logger.addHandler(self)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.logger.removeHandler(self)
