"""Log records caught while a test runs."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from types import TracebackType

Predicate = Callable[[logging.LogRecord], bool]


class Logged(logging.Handler):
    """Records of ``level`` and above from ``logger`` (and its children)
    while attached, as a context manager; made inside the test's loop."""

    def __init__(self, logger: str = "", level: int = logging.WARNING) -> None:
        super().__init__(level)
        self.logger = logging.getLogger(logger)
        self.records: list[logging.LogRecord] = []
        self._loop = asyncio.get_running_loop()
        self._waiters: list[tuple[Predicate, asyncio.Future[logging.LogRecord]]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        # Records may come from another thread (a watchdog): waiters are the loop's.
        self._loop.call_soon_threadsafe(self._notify, record)

    def _notify(self, record: logging.LogRecord) -> None:
        for predicate, future in list(self._waiters):
            if not future.done() and predicate(record):
                future.set_result(record)
                self._waiters.remove((predicate, future))

    def wait_for(self, predicate: Predicate) -> asyncio.Future[logging.LogRecord]:
        """The first record (caught so far or to come) matching ``predicate``."""
        future: asyncio.Future[logging.LogRecord] = self._loop.create_future()
        match = next((r for r in self.records if predicate(r)), None)
        if match is not None:
            future.set_result(match)
        else:
            self._waiters.append((predicate, future))
        return future

    def __enter__(self) -> Logged:
        self.logger.addHandler(self)
        # The logger drops records below its level before any handler sees them.
        self._level_before = self.logger.level
        if self.logger.getEffectiveLevel() > self.level:
            self.logger.setLevel(self.level)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.logger.removeHandler(self)
        self.logger.setLevel(self._level_before)
