"""Seeded train/validation splits (`train_val_split`, stratified by class by default), and the
seed check it shares with `peg.data.registry.load` (`peg.utils.scalars.check_seed`)."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from peg.utils.scalars import check_seed


def _split_counts(counts: np.ndarray, total: int) -> np.ndarray:
    """Per-class validation counts summing to `total`, proportional to `counts` (largest
    remainder method; ties go to the earlier class)."""
    quota = counts * (total / counts.sum())
    base = np.floor(quota).astype(np.int64)
    extra = total - int(base.sum())
    if extra > 0:
        order = np.argsort(-(quota - base), kind="stable")
        base[order[:extra]] += 1
    return base


def train_val_split(
    X: Tensor | np.ndarray,
    y: Tensor | np.ndarray,
    val_fraction: float = 0.2,
    seed: int = 0,
    stratify: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Seeded split into training and validation parts, stratified by class (PEG paper: 80:20).

    The validation part holds ceil(N · val_fraction) points (scikit-learn's rounding), shared
    among the classes in proportion to their sizes (largest-remainder rounding), so every class
    is split 80:20 up to one point. Both parts keep the original order of the points.

    Args:
        X: inputs `[N, ...]`.
        y: labels `[N]` (integers; with `stratify=False` any values, e.g. regression targets).
        val_fraction: share of the points for validation, 0 < val_fraction < 1.
        seed: seed of the NumPy generator choosing the points.
        stratify: keep class proportions (needs integer labels); False: a plain random split.

    Returns:
        `(X_train, y_train, X_val, y_val)`, tensors (numpy inputs are converted).
    """
    X = torch.as_tensor(X)
    y = torch.as_tensor(y)
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float, np.floating)):
        raise ValueError(f"val_fraction: expected a number in (0, 1), got {val_fraction!r}")
    if not 0 < float(val_fraction) < 1:
        raise ValueError(f"val_fraction: expected a number in (0, 1), got {val_fraction!r}")
    seed = check_seed(seed)
    if X.ndim == 0 or y.ndim != 1:
        raise ValueError(
            f"X, y: expected X [N, ...] and y [N], got shapes {tuple(X.shape)} and {tuple(y.shape)}"
        )
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X, y: {X.shape[0]} inputs but {y.shape[0]} labels")
    n = int(y.shape[0])
    n_val = math.ceil(n * float(val_fraction) - 1e-9)  # as scikit-learn's test_size
    if not 1 <= n_val <= n - 1:
        raise ValueError(
            f"val_fraction: {val_fraction} of {n} points leaves an empty training or "
            "validation part"
        )
    rng = np.random.default_rng(seed)
    if stratify:
        if torch.is_floating_point(y) or torch.is_complex(y) or y.dtype == torch.bool:
            raise ValueError(
                f"y: stratified splitting needs integer class labels, got {y.dtype} "
                "(pass stratify=False for a plain random split)"
            )
        labels = y.cpu().numpy()
        classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
        per_class = _split_counts(counts, n_val)
        chosen = []
        for c in range(len(classes)):
            members = np.flatnonzero(inverse == c)
            chosen.append(rng.permutation(members)[: per_class[c]])
        val_idx = np.sort(np.concatenate(chosen))
    else:
        val_idx = np.sort(rng.permutation(n)[:n_val])
    mask = np.ones(n, dtype=bool)
    mask[val_idx] = False
    train_idx = torch.from_numpy(np.flatnonzero(mask)).to(X.device)
    val_t = torch.from_numpy(val_idx).to(X.device)
    return X[train_idx], y[train_idx], X[val_t], y[val_t]
