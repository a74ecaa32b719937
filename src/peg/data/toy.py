"""Two-dimensional synthetic classification sets (PEG paper §5.6).

Every generator is seeded (a NumPy `Generator` or scikit-learn's `random_state`), so the same
arguments always give the same points. Points come shuffled; features are float32 `[n, 2]`
and labels int64 `[n]`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from peg.utils.scalars import check_number, check_positive_int, check_seed


def _counts(n: int, classes: int) -> list[int]:
    """Split n into `classes` counts that differ by at most one (the first get the extra)."""
    return [n // classes + (1 if k < n % classes else 0) for k in range(classes)]


def _to_tensors(X: np.ndarray, y: np.ndarray, rng: np.random.Generator) -> tuple[Tensor, Tensor]:
    order = rng.permutation(len(y))
    return (
        torch.from_numpy(np.ascontiguousarray(X[order], dtype=np.float32)),
        torch.from_numpy(np.ascontiguousarray(y[order], dtype=np.int64)),
    )


def linear(
    n: int = 400, noise: float = 0.0, margin: float = 1.0, seed: int = 0
) -> tuple[Tensor, Tensor]:
    """Two linearly separable clusters with an empty band of width `margin` between them.

    The classes lie on either side of the line through the origin orthogonal to
    w = (1, 1)/√2. Along w a point sits at ±(margin/2 + |g|), g ~ N(0, 1); across w it sits at
    N(0, 1.5²). With `noise=0` the classes are separated by exactly the band
    |x·w| < margin/2; `noise > 0` adds isotropic Gaussian jitter of that standard deviation
    (which may make points cross the band).

    Args:
        n: number of points (>= 2); class 0 gets n//2 points, class 1 the rest.
        noise: standard deviation of the jitter added to every coordinate.
        margin: width of the empty band between the classes (>= 0).
        seed: seed of the NumPy generator.

    Returns:
        `(X [n, 2] float32, y [n] int64)`, labels 0 and 1.
    """
    n = check_positive_int(n, "n", minimum=2)
    noise = check_number(noise, "noise", allow_zero=True)
    margin = check_number(margin, "margin", allow_zero=True)
    rng = np.random.default_rng(check_seed(seed))
    w = np.array([1.0, 1.0]) / math.sqrt(2.0)
    w_perp = np.array([-1.0, 1.0]) / math.sqrt(2.0)
    n0, n1 = n // 2, n - n // 2
    y = np.concatenate([np.zeros(n0, np.int64), np.ones(n1, np.int64)])
    along = margin / 2.0 + np.abs(rng.standard_normal(n))
    along = np.where(y == 1, along, -along)
    across = 1.5 * rng.standard_normal(n)
    X = along[:, None] * w + across[:, None] * w_perp
    if noise > 0:
        X = X + noise * rng.standard_normal(X.shape)
    return _to_tensors(X, y, rng)


def two_moons(n: int = 400, noise: float = 0.1, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Two interleaved half circles (`sklearn.datasets.make_moons`).

    Args:
        n: number of points (>= 2); classes get n//2 and n - n//2 points.
        noise: standard deviation of the Gaussian jitter.
        seed: `random_state` of make_moons.

    Returns:
        `(X [n, 2] float32, y [n] int64)`, labels 0 and 1.
    """
    n = check_positive_int(n, "n", minimum=2)
    noise = check_number(noise, "noise", allow_zero=True)
    from sklearn.datasets import make_moons  # here: `import peg.data` stays light

    X, y = make_moons(n_samples=n, noise=noise, shuffle=True, random_state=check_seed(seed))
    return (
        torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)),
        torch.from_numpy(np.ascontiguousarray(y, dtype=np.int64)),
    )


def three_moons(n: int = 600, noise: float = 0.1, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Three interleaved half circles of radius 1, one class each.

    Moon k is centred at x = k: moons 0 and 2 are upper half circles (cos t + k, sin t), moon 1
    is a lower one (cos t + 1, 0.5 − sin t), t evenly spaced on [0, π] (the layout of
    `make_moons`, continued by one moon). Gaussian jitter of standard deviation `noise` is
    added to both coordinates.

    Args:
        n: number of points (>= 3); classes get n//3 points each, the first ones one more when
            n is not a multiple of 3.
        noise: standard deviation of the Gaussian jitter.
        seed: seed of the NumPy generator.

    Returns:
        `(X [n, 2] float32, y [n] int64)`, labels 0, 1 and 2.
    """
    n = check_positive_int(n, "n", minimum=3)
    noise = check_number(noise, "noise", allow_zero=True)
    rng = np.random.default_rng(check_seed(seed))
    xs, ys = [], []
    for k, count in enumerate(_counts(n, 3)):
        t = np.linspace(0.0, math.pi, count)
        if k % 2 == 0:
            pts = np.stack([np.cos(t) + k, np.sin(t)], axis=1)
        else:
            pts = np.stack([np.cos(t) + k, 0.5 - np.sin(t)], axis=1)
        xs.append(pts)
        ys.append(np.full(count, k, dtype=np.int64))
    X, y = np.concatenate(xs), np.concatenate(ys)
    if noise > 0:
        X = X + noise * rng.standard_normal(X.shape)
    return _to_tensors(X, y, rng)
