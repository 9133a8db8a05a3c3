"""The front's private directory for its Unix sockets (the speech API's and
each media worker's), and the sweep of those a killed server left behind.

A front removes its directory when it stops; one killed with SIGKILL (the
OOM killer, ``kill -9``, a container stopped hard) cannot, and its
``voice-agent-*`` directory of dead sockets would stay in the temporary
directory for good. So each directory holds its owner's pid, and a front
starting removes the directories, in the same temporary directory and
owned by the same user, whose owner is no longer running. A directory
without the file, or whose pid is alive (or was reused by another
process), is left alone: only a directory known to be dead is removed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "voice-agent-"
OWNER_FILE = "owner.pid"


def make_runtime_dir() -> Path:
    """A new private directory (mode 0700) holding this process's pid."""
    path = Path(tempfile.mkdtemp(prefix=PREFIX))
    (path / OWNER_FILE).write_text(f"{os.getpid()}\n")
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: running
    return True


def sweep_stale_runtime_dirs(parent: Path | None = None) -> int:
    """Remove the directories dead fronts left in ``parent`` (the temporary
    directory by default); how many were removed."""
    base = Path(parent or tempfile.gettempdir())
    removed = 0
    for path in base.glob(f"{PREFIX}*"):
        owner = path / OWNER_FILE
        try:
            if not path.is_dir() or path.is_symlink() or path.stat().st_uid != os.getuid():
                continue
            pid = int(owner.read_text().strip())
        except (OSError, ValueError):
            continue  # no owner recorded (or unreadable): not known to be dead
        if pid == os.getpid() or _alive(pid):
            continue
        with contextlib.suppress(OSError):
            shutil.rmtree(path)
            removed += 1
    if removed:
        log.info("removed the runtime directories of dead servers", extra={"count": removed})
    return removed
