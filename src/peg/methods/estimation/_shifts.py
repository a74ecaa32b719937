"""The interval's half-width: each estimator's error under synthetic shifts of the source.

The validation points are split in two halves (seeded): the estimators are fitted on the first
(temperature included) and scored on shifted copies of the second, whose true accuracy is
known. The shifts (`shifted_sets`): label shift (the second half resampled to Dirichlet(1)
class priors); covariate shift towards harder inputs (the points resampled with weights
exp(−λ · confidence): p(x) moves, p(y | x) does not); miscalibration (scores multiplied by a
factor: confidence moves, accuracy does not); a little Gaussian noise on the scores (accuracy
falls, confidence much less: the case confidence-based estimators miss); tilts with label
shift. The half-width at `confidence`
is the `confidence` quantile of the absolute errors over these sets; `interval` widens it by the
target's own binomial sampling error. It reflects the method's error under shifts LIKE these
only: a shift of another kind (in p(y | x), or far stronger) can leave the truth outside.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import torch

NOISE = (0.25,)
#: the harder shifts, after the others (the width's disagreement scale is calibrated on all):
#: stronger logit noise; a weaker class signal (the true class's logit lowered by a share of
#: the median margin: p(y | x) as the model reads it changes, as in docs/monitor.md's
#: generator); a collapse (one class's logit raised: the predictions pile onto it while
#: their confidence stays)
STRONG_NOISE = (0.5,)
WEAKER = (0.5, 1.0, 1.5)
COLLAPSE = (0.5, 1.0)
TILTS = (3.0, 6.0, 10.0)
SCALES = (0.5, 2.0)
DIRICHLET = 1.0
N_LABEL_SHIFTS = 6


def split_halves(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    return order[: n // 2], order[n // 2 :]


def resample(
    rng: np.random.Generator, y: np.ndarray, classes: np.ndarray, priors: np.ndarray
) -> np.ndarray:
    """Indices `[len(y)]` into the labels `y`, drawn with replacement to class priors `[K]`
    over `classes` `[K]`: counts multinomial(len(y), priors), each class's drawn from its own
    points (in the order of `classes`). The one resampling of label shift, here and in auto's
    learned mode (`_learned.training_sets`)."""
    counts = rng.multinomial(len(y), priors)
    picks = [
        rng.choice(np.nonzero(y == c)[0], k, True)
        for c, k in zip(classes, counts, strict=True)
        if k > 0
    ]
    return np.concatenate(picks)


def shifted_sets(
    scores: torch.Tensor, y: torch.Tensor, seed: int
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, scores `[n, C]`, labels `[n]`) of each synthetic shift of one set (see the module)."""
    rng = np.random.default_rng(seed)
    n, classes = scores.shape
    spread = float(scores.std())
    y_np = y.numpy()
    every = np.arange(classes)
    present = np.isin(every, y_np)

    def resampled(priors: np.ndarray) -> np.ndarray:
        p = priors * present  # a class absent from y gets no points
        return resample(rng, y_np, every, p / p.sum())

    def noisy(s: torch.Tensor, sigma: float) -> torch.Tensor:
        noise = torch.from_numpy(rng.standard_normal(tuple(s.shape)))
        return s + sigma * spread * noise

    conf = scores.softmax(-1).max(-1).values.numpy()

    def tilted(lam: float, idx: np.ndarray) -> np.ndarray:
        w = np.exp(-lam * (conf[idx] - conf[idx].max()))
        return idx[rng.choice(len(idx), len(idx), True, w / w.sum())]

    everyone = np.arange(n)
    for sigma in NOISE:
        yield f"noise {sigma}", noisy(scores, sigma), y
    for lam in TILTS:
        idx = torch.from_numpy(tilted(lam, everyone))
        yield f"tilt {lam}", scores[idx], y[idx]
    for factor in SCALES:
        yield f"scale {factor}", scores * factor, y
    for i in range(N_LABEL_SHIFTS):
        idx = torch.from_numpy(resampled(rng.dirichlet(np.full(classes, DIRICHLET))))
        yield f"label shift {i}", scores[idx], y[idx]
    for i, lam in enumerate(TILTS[:2]):
        idx = resampled(rng.dirichlet(np.full(classes, DIRICHLET)))
        idx = torch.from_numpy(tilted(lam, idx))
        yield f"tilt {lam} + label shift {i}", scores[idx], y[idx]
    yield from _harder(scores, y, rng, noisy)


def _harder(
    scores: torch.Tensor, y: torch.Tensor, rng: np.random.Generator, noisy: Callable
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """The harder shifts (`STRONG_NOISE`, `WEAKER`, `COLLAPSE`), in the units of the median
    margin m between the true class's score and the best other one (`[n, C]` scores)."""
    n, classes = scores.shape
    rows = torch.arange(n)
    true = scores[rows, y]
    other = scores.clone()
    other[rows, y] = -torch.inf
    m = float((true - other.max(-1).values).abs().median().clamp_min(1e-3))
    for sigma in STRONG_NOISE:
        yield f"noise {sigma}", noisy(scores, sigma), y
    for delta in WEAKER:
        s = scores.clone()
        s[rows, y] -= delta * m
        yield f"weaker signal {delta}", s, y
    for b in COLLAPSE:
        s = scores.clone()
        s[:, int(rng.integers(classes))] += b * m
        yield f"collapse {b}", s, y


Predict = Callable[[torch.Tensor], tuple[dict[str, float], np.ndarray]]


def synthetic_errors(
    scores: torch.Tensor,
    y: torch.Tensor,
    fit: Callable[[torch.Tensor, torch.Tensor], Predict],
    seed: int,
) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """Each method's errors (estimate − truth) `[S]` over the synthetic shifts, each shift's
    distances from the source `[S, 4]` (`_reliability.distances`), and each shifted set's
    (true accuracy, points) `[S, 2]`: `fit(scores, y)` on the first half returns a function
    of a shifted set's scores giving every estimate and the distances."""
    first, second = split_halves(len(y), seed)
    predict = fit(scores[first], y[first])
    errors: dict[str, list[float]] = {}
    far: list[np.ndarray] = []
    truths: list[tuple[float, int]] = []
    for _, s, labels in shifted_sets(scores[second], y[second], seed):
        truth = float((s.argmax(-1) == labels).double().mean())
        values, distance = predict(s)
        far.append(distance)
        truths.append((truth, len(labels)))
        for key, value in values.items():
            errors.setdefault(key, []).append(value - truth)
    return {k: np.asarray(v) for k, v in errors.items()}, np.stack(far), np.asarray(truths)


def half_width(errors: np.ndarray, confidence: float) -> float:
    return float(np.quantile(np.abs(errors), confidence)) if len(errors) else 0.0


def sampling(accuracy: float | np.ndarray, n: int, confidence: float) -> np.ndarray:
    """The binomial sampling error at `confidence` of an accuracy read on n points (its
    variance floored at 0.25 / n, for an accuracy near 0 or 1)."""
    from scipy.stats import norm  # on use: `import peg` loads no scipy (tests/test_imports.py)

    z = float(norm.ppf(0.5 + confidence / 2))
    a = np.clip(accuracy, 0.0, 1.0)
    m = max(n, 1)
    return z * np.sqrt(np.maximum(a * (1 - a), 0.25 / m) / m)


def interval(accuracy: float, width: float, n: int, confidence: float) -> tuple[float, float]:
    """(lo, hi) clipped to [0, 1]: the shift half-width and the binomial sampling error of n
    target points at `confidence`, added in quadrature (independent errors)."""
    a = min(max(accuracy, 0.0), 1.0)
    half = float(np.hypot(width, sampling(a, n, confidence)))
    return max(0.0, a - half), min(1.0, a + half)
