"""`peg.Monitor`'s false-alarm rate on in-distribution chunks: the share of clean chunks on
which each test gives p < 0.01, the estimate leaves the band, and `alert` is set (the
Monitor's rule, `alpha=0.01`: p < 0.01 / 3 per test), by chunking: `by_size(n)` at n = 20,
50, 100, 500 and 2000, and `per_update()` on updates of 20 to 200 points (each judged by a
band of its own size).

- `synthetic`: a well-specified 4-class logit model (logits N(0, 1), + 2.5 on the true class);
  the source (2000 points) and every chunk are fresh draws from it.
- `digits`: logistic regression on 600 of sklearn's digits; the other 1197 split in half: the
  source, and a pool the chunks are drawn from with replacement (chunks of 500 and 2000 from a
  599-point pool are that pool's distribution, not the population's).

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/monitor_false_alarms.py synthetic 200
"""

from __future__ import annotations

import sys
import time
import warnings
from collections.abc import Callable

import numpy as np
import torch

import peg
from peg.apps.monitor import by_size, per_update

SIZES = (20, 50, 100, 500, 2000)
UPDATES = (20, 200)  # per_update(): each update's size drawn uniformly in this range
C = 4


def _synthetic(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    y = rng.integers(0, C, n)
    z = rng.standard_normal((n, C))
    z[np.arange(n), y] += 2.5
    return z.astype(np.float32), y


def _setup(kind: str) -> tuple[tuple[np.ndarray, np.ndarray], Callable]:
    """The source (logits, labels) and a draw(n, rng) of clean chunks' logits."""
    rng = np.random.default_rng(0)
    if kind == "synthetic":
        return _synthetic(2000, rng), lambda n, r: _synthetic(n, r)[0]
    from sklearn.datasets import load_digits
    from sklearn.linear_model import LogisticRegression

    X, y = load_digits(return_X_y=True)
    p = rng.permutation(len(y))
    train, rest = p[:600], p[600:]
    model = LogisticRegression(C=0.01, max_iter=2000).fit(X[train], y[train])
    z = model.decision_function(X[rest]).astype(np.float32)
    half = len(rest) // 2
    pool = z[half:]
    return (z[:half], y[rest][:half]), lambda n, r: pool[r.choice(len(pool), n, True)]


def main(kind: str = "synthetic", chunks: int = 200) -> None:
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    source, draw = _setup(kind)
    est = peg.PerformanceEstimator().fit(*source)
    print(f"{kind}: source {len(source[1])} points, {chunks} clean chunks per size")
    print("(tests: the share with p < 0.01; alert: the Monitor's, alpha=0.01)")
    print("| size | label shift | covariate | OOD | band | alert | seconds |")
    print("|---|---|---|---|---|---|---|")
    for size in (*SIZES, "per update"):
        start = time.perf_counter()
        chunker = per_update() if size == "per update" else by_size(size)
        m = peg.Monitor(est, chunker, seed=1)
        rng = np.random.default_rng(0 if size == "per update" else size)
        for _ in range(chunks):
            n = int(rng.integers(UPDATES[0], UPDATES[1] + 1)) if chunker.per_update else size
            m.update(draw(n, rng))

        def share(key: str, done: list = m.chunks) -> float:
            return float(np.mean([c[key] is not None and c[key] < 0.01 for c in done]))

        band = np.mean([any(a.kind == "band" for a in c.alerts) for c in m.chunks])
        alert = np.mean([c.alert for c in m.chunks])
        name = f"{UPDATES[0]}-{UPDATES[1]} per update" if chunker.per_update else size
        print(
            f"| {name} | {share('label_shift_p'):.3f} | {share('covariate_p'):.3f} | "
            f"{share('ood_p'):.3f} | {band:.3f} | {alert:.3f} | "
            f"{time.perf_counter() - start:.0f} |",
            flush=True,
        )


if __name__ == "__main__":
    main(
        sys.argv[1] if len(sys.argv) > 1 else "synthetic",
        int(sys.argv[2]) if len(sys.argv) > 2 else 200,
    )
