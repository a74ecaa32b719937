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


def round_robin(
    runs: dict[str, Callable[[], Any]], repeats: int, budget: float, most: int = 300
) -> dict[str, list[float]]:
    """Seconds of each `run()` per round, timed in turn (round robin: a slow spell of the
    machine touches every run of a round alike), after one untimed warm-up call each: at least
    `repeats` rounds, more for fast ones (~`budget` s in all, at most `most` rounds)."""
    first = 0.0
    for run in runs.values():
        start = time.perf_counter()
        run()
        first += time.perf_counter() - start
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(max(repeats, min(most, int(budget / max(first, 1e-6))))):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            samples[name].append(time.perf_counter() - start)
    return samples
