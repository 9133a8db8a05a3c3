"""numpy's BLAS is held to one thread in a serving process: OpenBLAS's idle
workers spin for about 0.1 s after every call, on the cores the models need
(Whisper's encoder ran 60 ms slower right after its feature extraction)."""

from __future__ import annotations

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

from voice_agent.cpu import limit_blas_threads
from voice_agent.engine import Engine


def blas_threads() -> list[int]:
    return [int(lib["num_threads"]) for lib in threadpool_info() if lib["user_api"] == "blas"]


def test_the_cap_reaches_the_blas_numpy_calls_and_zero_leaves_it_alone() -> None:
    np.ones((64, 64)) @ np.ones((64, 64))  # numpy's BLAS is loaded and in use
    with threadpool_limits(limits=2, user_api="blas"):
        assert set(blas_threads()) == {2}
        assert limit_blas_threads(0) == []
        assert set(blas_threads()) == {2}
        capped = limit_blas_threads(1)
        assert capped and all("blas" in path for path in capped)
        assert set(blas_threads()) == {1}


async def test_a_started_engine_has_capped_blas_at_its_setting(engine: Engine) -> None:
    assert engine.settings.blas_threads == 1
    assert blas_threads() and set(blas_threads()) == {1}
