"""What the benchmark scripts share (not a benchmark: `peg bench-perf` skips `_` files)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def median_time(run: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Median wall time of `repeats` calls, and the last call's result."""
    samples, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = run()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), out
