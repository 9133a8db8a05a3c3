"""Log lines as an operator reads them: one JSON object each, and a media
worker's lines naming the worker."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from voice_agent.logs import configure


@pytest.fixture
def restored_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_a_workers_lines_name_the_worker(restored_root: None) -> None:
    stream = io.StringIO()
    configure("INFO", "json", worker=1, stream=stream)
    log = logging.getLogger("voice_agent.loop_health")
    log.warning("event loop blocked for %d ms", 120, extra={"blocked_ms": 120})
    log.info("worker listening", extra={"worker": 1, "socket": "/tmp/w1.sock"})
    stalled, listening = lines(stream)
    assert stalled["msg"] == "event loop blocked for 120 ms"
    assert stalled["worker"] == 1 and stalled["blocked_ms"] == 120
    assert listening["worker"] == 1 and listening["socket"] == "/tmp/w1.sock"


def test_the_front_s_lines_carry_no_worker(restored_root: None) -> None:
    stream = io.StringIO()
    configure("INFO", "json", stream=stream)
    logging.getLogger("voice_agent").info("listening", extra={"url": "http://127.0.0.1:1"})
    (line,) = lines(stream)
    assert "worker" not in line and line["url"] == "http://127.0.0.1:1"


def test_text_lines_name_the_worker_too(restored_root: None) -> None:
    stream = io.StringIO()
    configure("INFO", "text", worker=0, stream=stream)
    logging.getLogger("voice_agent").warning("call failed")
    assert stream.getvalue().rstrip().endswith("call failed [worker=0]")
