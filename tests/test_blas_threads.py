"""numpy's BLAS is held to one thread in a serving process: OpenBLAS's idle
workers spin for about 0.1 s after every call, on the cores the models need
(Whisper's encoder ran 60 ms slower right after its feature extraction)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

from voice_agent.cpu import limit_blas_threads
from voice_agent.engine import Engine


def numpys_blas_threads() -> int:
    """Threads of the BLAS numpy itself was built with (other libraries,
    SciPy's own OpenBLAS for one, may be loaded beside it)."""
    ours = [
        int(lib["num_threads"])
        for lib in threadpool_info()
        if lib["user_api"] == "blas" and "numpy" in str(lib["filepath"])
    ]
    assert len(ours) == 1, threadpool_info()
    return ours[0]


def test_the_cap_reaches_numpys_blas_and_zero_leaves_it_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)  # restored afterwards
    np.ones((64, 64)) @ np.ones((64, 64))  # numpy's BLAS is loaded and in use
    with threadpool_limits(limits=2, user_api="blas"):
        assert numpys_blas_threads() == 2
        assert limit_blas_threads(0) == []
        assert numpys_blas_threads() == 2
        capped = limit_blas_threads(1)
        assert capped and all("blas" in path for path in capped)
        assert numpys_blas_threads() == 1
        # A BLAS loaded after this reads its thread count from the environment.
        assert os.environ["OPENBLAS_NUM_THREADS"] == "1"


async def test_a_started_engine_has_capped_blas_at_its_setting(engine: Engine) -> None:
    assert engine.settings.blas_threads == 1
    assert numpys_blas_threads() == 1
