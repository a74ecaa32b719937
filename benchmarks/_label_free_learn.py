"""The learned "auto" of `benchmarks/label_free.py`, scored leave one corruption family out.

"auto" learns from corrupted copies of the SOURCE: `--source-copies` validation images (a
seeded subsample: `np.random.default_rng(123)`), each of the data set's corruptions × severities
1–5 (corruption seed 1; the targets use seed 0 on other images), their logits cached as `.npy`
under `--cache/learn/<dataset>/`. The estimator is fitted on the other validation points with
these copies as `shifted=` (what `fit(model, (X, y))` does itself, cached here so a rerun is
cheap). For a target set of corruption family f (`peg.methods.estimation._learned.FAMILIES`),
its combiner is refitted on the copies of every other family: it never saw family f. Label
shift and clean targets use the combiner fitted on all copies (label shift draws of the source
are part of its training sets, as in the library).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

import peg
from peg.data import corruptions as cc
from peg.methods.estimation import _learned

SUBSAMPLE_SEED, CORRUPTION_SEED = 123, 1


def source_copies(
    logits_of: Callable[[torch.Tensor], np.ndarray],
    images: Callable[[], torch.Tensor],
    labels: np.ndarray,
    names: tuple[str, ...],
    folder: Path,
    points: int,
) -> tuple[list, np.ndarray]:
    """((name, logits `[m, C]`, labels `[m]`) of the clean subsample and each corruption ×
    severity, the indices `[N - m]` of the validation points NOT in the subsample)."""
    folder.mkdir(parents=True, exist_ok=True)
    order = np.random.default_rng(SUBSAMPLE_SEED).permutation(len(labels))
    sub, rest = order[:points], order[points:]
    y = labels[sub]
    X: list[torch.Tensor] = []

    def cached(name: str, make: Callable[[], torch.Tensor]) -> np.ndarray:
        path = folder / f"{name}.npy"
        if path.is_file():
            return np.load(path, allow_pickle=False)
        if not X:
            X.append(images()[torch.from_numpy(sub)])
        out = logits_of(make())
        np.save(path, out)
        return out

    sets = [("clean", cached("clean", lambda: X[0]), y)]
    for name in names:
        for s in _learned.SEVERITIES:
            make = lambda n=name, s=s: cc.corrupt(X[0], n, s, seed=CORRUPTION_SEED)  # noqa: E731
            sets.append((f"{name} {s}", cached(f"{name}-{s}", make), y))
    return sets, rest


class LeaveOneFamilyOut:
    """The learned "auto" fitted once on every copy; `estimate(name, kind, logits)` reads a
    target with the combiner refitted without the target's corruption family."""

    def __init__(self, V: np.ndarray, VL: np.ndarray, copies: list, rest: np.ndarray) -> None:
        self.est = peg.PerformanceEstimator("auto").fit(V[rest], VL[rest], shifted=copies)
        self.auto = self.est.estimators_["auto"]
        self.learned = self.auto.learned
        self.widths: dict[str, float] = {}

    def estimate(self, name: str, kind: str, logits: np.ndarray) -> tuple[float, float]:
        """(accuracy, half-width at 90%) of one target set."""
        held = _learned.family(name) if kind.startswith("corruption") else None
        self.learned.refit(held)
        width = self.widths.setdefault(
            str(held), float(np.quantile(np.abs(self.learned.errors_), 0.9))
        )
        summary = self.est.summary()
        self.est.add(summary, torch.from_numpy(logits))
        return self.learned.estimate(summary), width
