"""The pieces of `AutoSelect`'s cross-fitting that know nothing of methods: stratified, seeded
folds as index sets (`stratified_folds`), per-point scores (`point_scores`) and the paired
statistics of the selection (`mean_se`). A fold's view of the labelled data, which reads nothing
until it is used, is `peg.source._rows.ValSource.view`.
"""

from __future__ import annotations

import math
import warnings

import torch
from torch import Tensor

from peg.metrics._inputs import ensemble_log_probs
from peg.source._devices import move

CRITERIA = ("nll", "brier")
# the fewest validation points a fold may hold: one point gives a fold's score no spread (the
# race's paired SE needs two), and 2 points cross-validated scored ± 4 nats with a warning only
MIN_FOLD_POINTS = 2
# ... and below this many a fold on average, a warning: the scores are noisy
FEW_FOLD_POINTS = 10
# mean differences in the criterion below this (nats, or Brier units) are ties: the fits'
# numerical noise, not a difference (vector scaling shrunk to temperature scaling's map scored
# 1.4e-9 ± 1.3e-9 below it, "beyond one SE", and was chosen at 3 × the fit time)
TIE = 1e-6


def check_fold_sizes(n: int, k: int, nested: bool = False) -> None:
    """Refuse `cv=k` folds of `n` validation points where a fold would hold fewer than
    `MIN_FOLD_POINTS` (a ValueError naming `cv` and the largest cv the data allow: from the
    counts alone, before any fold is built or forward pass run: `cv=2**31` once built two
    billion lists); with `nested`, the inner folds of the smallest outer complement too. Warn
    where a fold holds fewer than `FEW_FOLD_POINTS` on average."""
    most = n // MIN_FOLD_POINTS
    if k > most:
        fix = f"give cv <= {most} or more validation data"
        if most < 2:
            fix = f"cross-validation needs at least {2 * MIN_FOLD_POINTS}: give more of them"
        raise ValueError(
            f"cv: {k:,} folds of {n} validation points leave folds of fewer than "
            f"{MIN_FOLD_POINTS} points; {fix}"
        )
    rest = n - -(-n // k)  # the smallest outer complement (fold sizes differ by one at most)
    if nested and k > rest // MIN_FOLD_POINTS:
        raise ValueError(
            f"cv: nested={nested} runs {k} inner folds on {rest} of the {n} validation points, "
            f"leaving folds of fewer than {MIN_FOLD_POINTS} points: give a smaller cv, more "
            "validation data or nested=False"
        )
    if n < FEW_FOLD_POINTS * k:
        warnings.warn(
            f"cv: {k} folds of {n} validation points hold {n / k:.1f} each (fewer than "
            f"{FEW_FOLD_POINTS}): every candidate is fitted on {n - -(-n // k)} points or so, "
            "and the CV scores are noisy (the report's ± says how much); more validation data "
            "gives a steadier choice",
            UserWarning,
            stacklevel=3,
        )


def stratified_folds(y: Tensor, k: int, seed: int) -> list[Tensor]:
    """`k` disjoint index sets `[n_i]` covering `range(len(y))`, each class spread evenly over
    them (its points shuffled with `seed`, then dealt out in turn); every class with at least
    `k` points is in every fold, so a fold's complement has every class the data has. A class
    with fewer points (1,000 classes, 5,000 points: a few per class) is in fewer folds: a
    warning names how many such classes there are and the fewest points, and the maps fitted
    on a complement without a class hold it at temperature scaling's map (scikit-learn's
    StratifiedKFold warns and goes on likewise). The folds are CPU index sets, whatever `y`'s
    device: CPU indices index tensors on any device (the data's, the cached logits')."""
    y = y.cpu()
    classes, counts = torch.unique(y, return_counts=True)
    short = [(int(c), int(n)) for c, n in zip(classes, counts, strict=True) if n < k]
    if short:
        c, n = min(short, key=lambda cn: cn[1])
        warnings.warn(
            f"cv: {len(short)} of {len(classes)} classes have fewer than {k} validation points "
            f"(class {c}: {n}), so some folds are scored or fitted without them; the scores of "
            "the maps with parameters per class are noisier there (more validation data, or a "
            "smaller cv, avoids it)",
            UserWarning,
            stacklevel=3,
        )
    g = torch.Generator().manual_seed(int(seed))
    folds: list[list[Tensor]] = [[] for _ in range(k)]
    start = 0  # the fold the next class starts at, so that fold sizes stay within one point
    for c in classes:
        members = torch.nonzero(y == c).flatten()
        members = members[torch.randperm(len(members), generator=g)]
        for j in range(k):
            folds[(start + j) % k].append(members[j::k])
        start = (start + len(members)) % k
    return [torch.sort(torch.cat(parts)).values for parts in folds]


def point_scores(logits: Tensor, y: Tensor, criterion: str) -> Tensor:
    """Per-point scores `[N]` (float64, lower is better, on the CPU where the selection's
    statistics are taken) of member logits `[M, N, C]`: the NLL of the averaged prediction, or
    its Brier score (summed over classes). `y` follows the logits."""
    log_p = ensemble_log_probs(logits)
    y = move(y, log_p.device, "val labels").long()
    if criterion == "nll":
        return (-log_p.gather(1, y[:, None])[:, 0]).cpu()
    p = log_p.exp()
    p[torch.arange(len(y), device=p.device), y] -= 1.0
    return (p * p).sum(1).cpu()


def beyond(diff: float, se: float, times: float = 1.0) -> bool:
    """Whether a paired mean difference `diff` exceeds `times` standard errors `se` and the
    numerical floor `TIE` (below it, a tie whatever the SE)."""
    return diff > max(times * se, TIE)


def mean_se(points: Tensor) -> tuple[float, float]:
    """Mean and standard error (sample std / √n) of per-point values `[N]`."""
    n = points.numel()
    mean = float(points.mean())
    se = float(points.std(unbiased=True)) / math.sqrt(n) if n > 1 else float("nan")
    return mean, se
