"""A media worker imports the voice_agent its front runs, whatever the
directory it starts in holds (another checkout's voice_agent/, as a bench
pairing two builds has)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import voice_agent
from voice_agent.server.worker_pool import same_code_interpreter


def test_the_worker_interpreter_imports_the_fronts_voice_agent(tmp_path: Path) -> None:
    decoy = tmp_path / "voice_agent"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("")
    interpreter, env = same_code_interpreter()
    done = subprocess.run(
        [*interpreter, "-c", "import voice_agent; print(voice_agent.__file__)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert Path(done.stdout.strip()) == Path(voice_agent.__file__).resolve()
