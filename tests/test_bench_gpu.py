"""bench/gpu.sh refuses to run without a usable CUDA GPU (exit 2, saying
why), and bench/stt_streams.py, the STT bench it runs, produces its table
with the tiny NeMo model on the CPU."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import stt_streams

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "bench" / "gpu.sh"
BASH = shutil.which("bash") or "/bin/bash"


def gpu_sh(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [BASH, str(SCRIPT), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def test_without_nvidia_smi_it_exits_2_and_says_so(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # only what the script needs before its check
    bin_dir.mkdir()
    dirname = shutil.which("dirname")
    assert dirname is not None
    (bin_dir / "dirname").symlink_to(dirname)
    result = gpu_sh(env={"PATH": str(bin_dir), "OUT": str(tmp_path / "out")})
    assert result.returncode == 2, result.stderr
    assert "nvidia-smi is not on PATH" in result.stderr
    assert "no usable CUDA GPU, nothing was run" in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "out").exists()


def test_without_cuda_torch_it_exits_2_and_says_so(tmp_path: Path) -> None:
    # A driver that lists a GPU, and a Python whose torch sees no CUDA.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    executable(bin_dir / "nvidia-smi", "#!/bin/sh\necho 'GPU 0: Test GPU (UUID: GPU-0)'\n")
    python = executable(
        tmp_path / "python",
        "#!/bin/sh\n"
        'case "$2" in\n'
        "  *is_available*) exit 1 ;;\n"
        "  *version*) echo '2.13.0+cpu CUDA None' ;;\n"
        "esac\n",
    )
    env = {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": str(python),
        "OUT": str(tmp_path / "out"),
    }
    result = gpu_sh(env=env)
    assert result.returncode == 2, result.stderr
    assert "torch sees no CUDA GPU (torch 2.13.0+cpu CUDA None)" in result.stderr
    assert result.stdout == ""


def test_usage() -> None:
    result = gpu_sh("--help", env={})
    assert result.returncode == 0
    assert "PARAKEET_MODEL" in result.stdout and "HF_HUB_OFFLINE" in result.stdout
    assert gpu_sh("--no-such-option", env={}).returncode == 1


def test_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck is not installed")
    result = subprocess.run(
        [shellcheck, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout


@pytest.mark.slow
def test_tiny_model_streams_on_the_cpu(
    tiny_nemo_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--model", str(tiny_nemo_model), "--device", "cpu"]
    argv += ["--streams", "1,3", "--seconds", "4", "--threads", "1"]
    assert stt_streams.main(argv) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    rows = [
        dict(zip(header, (cell.strip() for cell in line.strip("|").split("|")), strict=True))
        for line in lines[2:]
    ]
    assert [row["streams"] for row in rows] == ["1", "3"]
    for row in rows:
        assert int(row["finals"]) == int(row["utterances"]) >= int(row["streams"])
        assert int(row["failures"]) == 0 and int(row["timeouts"]) == 0
        assert float(row["first final p50 ms"]) > 0 and float(row["RTF"]) > 0
        assert int(row["partials done/shed"].split("/")[0]) > 0
    assert "on cpu" in out and "first final: end of the utterance's audio" in out
