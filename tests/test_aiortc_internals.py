"""The aiortc internals this package patches are patched only on the
versions they were written against, and the pins say the same."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiortc.rtcsctptransport import RTCSctpTransport

from voice_agent.rtc import datachannel, internals

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_checks() -> Iterator[None]:
    internals._mismatches.cache_clear()
    internals._refuse.cache_clear()
    yield
    internals._mismatches.cache_clear()
    internals._refuse.cache_clear()


def test_the_pins_are_the_patched_versions() -> None:
    for source in ("pyproject.toml", "constraints.txt"):
        text = (ROOT / source).read_text()
        for package, version in internals.PATCHED_VERSIONS.items():
            assert re.search(rf'^\s*"?{package}=={re.escape(version)}"?,?$', text, re.M), source


def test_the_installed_versions_are_patched(fresh_checks: None) -> None:
    assert internals.patchable("test")
    datachannel.contain_bad_messages()
    assert RTCSctpTransport._data_channel_receive is datachannel._receive


def test_another_version_is_left_unpatched_and_said_once(
    fresh_checks: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(internals, "installed_version", lambda package: "99.0.0")
    with caplog.at_level(logging.ERROR, logger=internals.__name__):
        assert not internals.patchable("data channel receive")
        assert not internals.patchable("data channel receive")
    (record,) = caplog.records
    assert "aiortc 99.0.0 (patched for 1.16.0)" in record.__dict__["installed"]
    assert record.__dict__["patch"] == "data channel receive"
