"""The default regularisation of vector / matrix scaling and Dirichlet calibration
(`reg_lambda="auto"`, `reg_mu="auto"`): shrinkage towards temperature scaling, its strength
chosen by cross-validation on the validation data.

Why: fitted without a penalty (or with Kull et al.'s ODIR, which leaves W's diagonal free) the
maps lose to temperature scaling where there are few points per class: at 1000 classes and
5000 points, vector scaling's test NLL was 11.5 against TS's 2.24, Dirichlet's 145.

The penalty (`strengths_penalty`): the map θ is pulled towards temperature scaling's θ_T
(W = I / T, b = 0, T fitted on all the validation data), every entry e by
    coef_e (θ_e - θ_T,e)²,  coef_e = k · C / (2 N) · a_e,
a_e the curvature of the NLL along e at θ_T averaged over the classes (W's diagonal: the mean
of p(1 - p) s²; b: of p(1 - p); W's off-diagonal: of p_i(1 - p_i) s_j²). So k is the weight
of the prior in points per class: a class with n_c points moves from θ_T by about
n_c / (n_c + k) of what it would alone, whatever C, N and the scale of the scores. k = ∞ is
temperature scaling itself, k = 0 no penalty (Guo et al.'s maps).

Two strengths, chosen one after the other on `GRID` (k from strong to weak), by `cv`-fold
cross-validation (seeded random folds; the NLL of every point where it was held out),
each fold's fit warm-started from its fit at the previous k, stopping at the first k whose
cross-validated NLL is not lower than the best one's (it rises beyond the optimum):
1. `k_diagonal`, on W's diagonal and b: vector scaling, and the diagonal part of the full maps;
2. for a full W (matrix scaling, Dirichlet calibration), `k_off` on its off-diagonal, with
   k_diagonal fixed, from the best diagonal maps (k_off = ∞: the diagonal map).
The map is then refitted on all the validation data at the chosen strengths, from the folds'
mean. Because k = ∞ (temperature scaling) is on the path, a weaker k is kept only where it
predicted held-out points better: the default does not lose to TS beyond the noise of the
cross-validation (T is fitted on all the data, which favours k = ∞ slightly: conservative).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from peg.methods.calibration._affine import (
    affine,
    diagonal_of,
    diagonal_part,
    embed,
    live_rows,
    temperature_map,
    unpack,
    usable,
)
from peg.methods.calibration._affine_solvers import Penalty, minimise, score_basis, split
from peg.methods.calibration.temperature import fit_temperature

GRID = (100.0, 30.0, 10.0, 3.0, 1.0, 0.3, 0.0)  # k, prior points per class, after k = ∞
FOLDS = 2  # cross-validation folds (the default `cv`)
# the fits along the path stop at a predicted decrease below this (nats): far below the noise
# the path's choice is made in (a one-SE rule, SE ~ 0.005 nats), and 1e-6 cost 1.4 x the time
# of 1e-4 at 1,000 classes (matrix scaling 38.6 s against 27.4 s) for the same choice and the
# same test NLL to 4 decimals at 10, 100 and 1,000 classes (the refit at the chosen k keeps
# `minimise`'s own tolerance)
PATH_TOL = 1e-4


# what each kind `reduces_to` names is, in words (AutoSelect's report)
REDUCED = {
    "temperature": "temperature scaling's map (a prior of ∞ points per class)",
    "diagonal": "the diagonal map (an off-diagonal prior of ∞)",
}


def reduces_to(record: dict[str, Any] | None, full: bool) -> str | None:
    """The simpler map a fit of `fit_auto` is, by the strengths it chose (its `record`; None: a
    fit at fixed strengths, no such claim): "temperature" where every strength is ∞ (W = I / T,
    b = 0: temperature scaling's map), "diagonal" for a full map whose off-diagonal strength is
    ∞ (the diagonal map), else None."""
    if record is None:
        return None
    if full and "k_off" in record and record["k_off"] is None:
        return "temperature" if record.get("k_diagonal", 0.0) is None else "diagonal"
    if not full and "k_diagonal" in record and record["k_diagonal"] is None:
        return "temperature"
    return None


def curvatures(s: Tensor, temperature: float) -> tuple[float, float, float]:
    """(a_diagonal, a_bias, a_off): the NLL's curvature along W's diagonal, b and W's
    off-diagonal at temperature scaling's map, averaged over the classes (see the module doc)."""
    p = (s / temperature).softmax(-1)
    q = p * (1 - p)  # [N, C]
    a_diag = float((q * s.square()).mean())
    a_off = float((q.mean(1) * s.square().mean(1)).mean())
    return a_diag, float(q.mean()), a_off


def strengths_penalty(
    centre: Tensor, a: tuple[float, float, float], n: int, live: Tensor,
    k_diagonal: float, k_off: float | None = None,
) -> Penalty:  # fmt: skip
    """The penalty of strengths k (see the module doc) around `centre` θ_T `[C, K]` for a fit
    on n points; `k_off` None: a diagonal map. An entry of strength ∞ is held at the centre
    (`Penalty.live`)."""
    c = centre.shape[0]
    strength = torch.empty_like(centre)
    curvature = torch.empty_like(centre)
    strength[:, -1], curvature[:, -1] = k_diagonal, a[1]
    if k_off is None:
        strength[:, 0], curvature[:, 0] = k_diagonal, a[0]
    else:
        strength[:, :-1], curvature[:, :-1] = k_off, a[2]
        strength[:, :-1].diagonal().fill_(k_diagonal)
        curvature[:, :-1].diagonal().fill_(a[0])
    held = torch.isinf(strength)
    coef = torch.where(held, 0.0, strength * curvature * (c / (2 * n)))
    return Penalty(coef, centre, live * ~held)


def random_folds(n: int, folds: int, device: torch.device) -> list[tuple[Tensor, Tensor]]:
    """(fit rows, held-out rows) of `folds` folds of a seeded random order. Not stratified by
    label: dealing each class's points evenly makes a class's frequency in the held-out fold
    that of the fitting folds, and the intercepts, which learn those frequencies, look better
    than they are (100 classes, 10 points a class: a cross-validated gain of 0.05 nats that
    was a loss of 0.02 on new data)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0)).to(device)
    fold = torch.empty_like(order)
    fold[order] = torch.arange(n, device=device) % folds
    return [((fold != f).nonzero()[:, 0], (fold == f).nonzero()[:, 0]) for f in range(folds)]


PenaltyOf = Callable[[float, Tensor, int], Penalty]  # (k, live rows, n) -> penalty


def _path(
    s: Tensor, y: Tensor, splits: list[tuple[Tensor, Tensor]], starts: list[Tensor],
    penalty_of: PenaltyOf, full: bool, max_iter: int, basis: Any,
) -> tuple[float, list[Tensor], dict[str, float]]:  # fmt: skip
    """(chosen k, the folds' maps at it, {k: cross-validated NLL}) along `GRID` from the folds'
    maps at k = ∞ (`starts`), warm-started, stopping once the NLL stops falling; the chosen k
    is the strongest whose NLL is within one standard error (of its paired difference, per
    point) of the lowest: the noise of a small validation set favours weak priors, which then
    lose on new data (100 points, 10 classes: k = 3 chosen by the lowest NLL, +0.03 nats
    against TS on test; k = 30, the test's best, within one SE)."""

    def held_losses(thetas: list[Tensor]) -> Tensor:
        losses = torch.empty(len(y), dtype=s.dtype, device=s.device)
        for (_, h), t in zip(splits, thetas, strict=True):
            losses[h] = F.cross_entropy(affine(s[h], *split(t, full)), y[h], reduction="none")
        return losses

    path = [(math.inf, starts, held_losses(starts))]
    for k in GRID:
        thetas = [
            minimise(
                t, s[f], y[f], penalty_of(k, live_rows(y[f], s.shape[1], s), len(f)),
                full, max_iter, basis, PATH_TOL,
            )
            for (f, _), t in zip(splits, path[-1][1], strict=True)
        ]  # fmt: skip
        path.append((k, thetas, held_losses(thetas)))
        if not float(path[-1][2].mean()) < min(float(p[2].mean()) for p in path[:-1]):
            break
    best = min(path, key=lambda p: float(p[2].mean()))[2]
    for k, thetas, losses in path:  # strongest first  # noqa: B007 (the chosen one)
        gap = losses - best
        if float(gap.mean()) <= float(gap.std()) / math.sqrt(len(y)) if len(y) > 1 else True:
            break
    return k, thetas, {f"{q:g}": float(p.mean()) for q, _, p in path}


def fit_auto(
    scores: Tensor, y: Tensor, *, full: bool, max_iter: int = 200, cv: int = FOLDS
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """(W, b, what was chosen) for scores `[N, C]`, labels `[N]`: the map shrunk towards
    temperature scaling by the strengths cross-validation chose (see the module doc). The
    record: T, k_diagonal and k_off (None: ∞) and the cross-validated NLL of each k tried."""
    s, y = usable(scores, y)
    n, c = s.shape
    t = fit_temperature(s, y, label=None)
    a = curvatures(s, t)
    diagonal_centre = temperature_map(c, t, False, s)
    splits = random_folds(n, min(cv, n), s.device)
    live = live_rows(y, c, s)

    def diagonal_penalty(k: float, rows: Tensor, m: int) -> Penalty:
        return strengths_penalty(diagonal_centre, a, m, rows, k)

    starts = [diagonal_centre] * len(splits)
    k_d, fold_maps, cv_d = _path(s, y, splits, starts, diagonal_penalty, False, max_iter, None)
    record: dict[str, Any] = {"temperature": t, "cv_nll_diagonal": cv_d}
    record["k_diagonal"] = None if k_d == math.inf else k_d
    if not full:
        start = torch.stack(fold_maps).mean(0)
        theta = minimise(start, s, y, diagonal_penalty(k_d, live, n), False, max_iter)
        return (*unpack(theta, False), record)
    centre = temperature_map(c, t, True, s)

    def full_penalty(k: float, rows: Tensor, m: int) -> Penalty:
        return strengths_penalty(centre, a, m, rows, k_d, k)

    basis = score_basis(s) if centre.numel() > 1200 else None  # one preconditioner for all
    starts = [embed(m) for m in fold_maps]
    k_o, fold_maps, cv_o = _path(s, y, splits, starts, full_penalty, True, max_iter, basis)
    record["k_off"] = None if k_o == math.inf else k_o
    record["cv_nll_off"] = cv_o
    start = torch.stack(fold_maps).mean(0)
    if k_o == math.inf:  # the diagonal map: refitted as one (cheaper), embedded
        pen = diagonal_part(full_penalty(0.0, live, n))
        theta = embed(minimise(diagonal_of(start), s, y, pen, False, max_iter))
    else:
        theta = minimise(start, s, y, full_penalty(k_o, live, n), True, max_iter, basis)
    return (*unpack(theta, True), record)
