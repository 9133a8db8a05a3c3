"""The front's runtime directory: a front starting removes the ones fronts
killed with SIGKILL left behind, and only those (real processes, a real
temporary directory)."""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest

from voice_agent.server.runtime_dir import OWNER_FILE, make_runtime_dir, sweep_stale_runtime_dirs


def runtime_dir(parent: Path, name: str, owner: int | None) -> Path:
    path = parent / f"voice-agent-{name}"
    path.mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as listener:  # a dead server's socket
        listener.bind(str(path / "speech.sock"))
    if owner is not None:
        (path / OWNER_FILE).write_text(f"{owner}\n")
    return path


def test_only_the_directories_of_dead_owners_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    running = subprocess.Popen(["sleep", "30"])
    try:
        gone = runtime_dir(tmp_path, "dead", dead.pid)
        kept = [
            runtime_dir(tmp_path, "running", running.pid),
            runtime_dir(tmp_path, "mine", os.getpid()),
            runtime_dir(tmp_path, "unowned", None),  # no owner file: not known to be dead
        ]
        (tmp_path / "voice-agent-file").write_text("not a directory")
        other = tmp_path / "other-dead"
        other.mkdir()
        (other / OWNER_FILE).write_text(f"{dead.pid}\n")

        assert sweep_stale_runtime_dirs(tmp_path) == 1
        assert not gone.exists()
        assert all(path.is_dir() for path in kept)
        assert other.is_dir() and (tmp_path / "voice-agent-file").is_file()
        assert sweep_stale_runtime_dirs(tmp_path) == 0
    finally:
        running.kill()
        running.wait()


def test_a_new_runtime_directory_is_private_and_names_its_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = make_runtime_dir()
    assert path.parent == tmp_path and path.name.startswith("voice-agent-")
    assert path.stat().st_mode & 0o777 == 0o700
    assert int((path / OWNER_FILE).read_text()) == os.getpid()
    assert sweep_stale_runtime_dirs(tmp_path) == 0  # its owner is alive
