"""Wall-clock measurements shared by the benchmarks and the performance page.

Speed is reported as ratios of timings taken in the same process, never asserted by a timed test.

>>> t = timed(lambda: sum(range(1000)), repeat=3)
>>> sorted(t), t["repeats"] >= 3
(['median', 'min', 'repeats'], True)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import nullcontext

import numpy as np

__all__ = ["blas_threads", "timed"]


def timed(fn: Callable[[], object], repeat: int, min_time: float = 0.0) -> dict:
    """Median and minimum of ``repeat`` wall-clock timings of ``fn()``, repeated until at least
    ``min_time`` seconds were spent (at most 50 × ``repeat`` calls): ``{"median", "min", "repeats"}``."""
    if repeat < 1:
        raise ValueError(f"repeat must be at least 1, got {repeat}")
    times = []
    start = time.perf_counter()
    while len(times) < repeat or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        if len(times) >= 50 * repeat:
            break
    return dict(median=float(np.median(times)), min=float(np.min(times)), repeats=len(times))


def blas_threads(threads: int | None):
    """Context: BLAS limited to ``threads`` (``None``: the default threading).

    On a loaded machine multi-threaded BLAS can make small products many times slower, so
    measurements of the flop-bound part take the faster of the two settings.
    """
    if threads is None:
        return nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=threads, user_api="blas")
