"""The warnings of few validation points: per class, for the calibrators with parameters per
class (vector / matrix scaling, Dirichlet calibration, histogram binning, isotonic regression):
what they fit of a class rests on its few points (at 1000 classes and 5 points a class,
unregularised vector scaling's test NLL was 11.5 against temperature scaling's 2.24);
per parameter, for the maps whose few parameters serve every class (ensemble temperature
scaling's temperature and weights, order-preserving scaling's slopes), the same threshold."""

from __future__ import annotations

import warnings

import torch
from torch import Tensor

FEW_POINTS = 10  # fewer validation points per class (or per shared parameter): a warning


def warn_few_points(y: Tensor, classes: int, label: str, outcome: str) -> None:
    """Warn, naming the map (`label`) and the counts, when the labels `y` `[N]` hold fewer
    than `FEW_POINTS` points per class on average; `outcome` says what the map did about it."""
    if len(y) >= FEW_POINTS * classes:
        return
    fewest = int(torch.bincount(y.long(), minlength=classes).min())
    warnings.warn(
        f"val: {label} fits parameters per class from {len(y)} points for {classes} classes "
        f"({len(y) / classes:.1f} per class on average, fewest {fewest}; fewer than "
        f"{FEW_POINTS} per class); {outcome}",
        stacklevel=5,
    )


def warn_few_points_shared(points: int, parameters: int, label: str, outcome: str) -> None:
    """Warn, naming the map (`label`) and the counts, when `points` validation points are
    fewer than `FEW_POINTS` per parameter of a map shared by every class (called from
    `_fit_map`: the warning points at the user's `fit`)."""
    if points >= FEW_POINTS * parameters:
        return
    warnings.warn(
        f"val: {label} fits {parameters} parameters shared by every class from {points} points "
        f"({points / parameters:.1f} per parameter; fewer than {FEW_POINTS}); {outcome}",
        stacklevel=4,
    )
