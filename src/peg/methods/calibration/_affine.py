"""Fitting an affine map of scores, s ↦ s W^T + b, on NLL plus the penalties of Kull et al. 2019
(what vector / matrix scaling and Dirichlet calibration share; `peg.methods.calibration.scaling`).

The parameters are θ `[C, K]`: for a full W, θ = [W | b] (K = C + 1, acting on x = [s, 1]); for
a diagonal W (vector scaling), row c is (w_c, b_c) (K = 2, acting on (s_c, 1)). The penalty is
Σ coef ⊙ (θ - centre)² (`Penalty`): for fixed ODIR / L2 strengths, the per-entry weights
`coefficients` gives (means over the entries they cover, as in the paper) and centre 0; for
strengths chosen from the data, shrinkage towards temperature scaling
(`peg.methods.calibration._affine_select`).

Every fit starts from temperature scaling's map (W = I / T, b = 0; `fit_temperature`): from
the identity, on scores 45 apart, the curvature underflows and Newton's method did not move.
The rows of a class absent from the labels stay there (`Penalty.live`): its NLL
falls without bound as its probability goes to 0 (on log p̄ <= 0 by its diagonal weight
growing: Dirichlet's test NLL of 145 at 1000 classes was W_cc ~ 1e4 on the classes
absent from the validation labels, not an optimiser's failure). The optimisers (Newton's
method where the Hessian is small and cheap to form, truncated Newton otherwise; a full W at
many classes started from the best diagonal one) are `peg.methods.calibration._affine_solvers`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from peg.methods.calibration import _affine_solvers as solvers
from peg.methods.calibration._affine_solvers import Penalty, minimise, split
from peg.methods.calibration.temperature import fit_temperature

# log of the smallest float64 > 0: log p̄ = -inf is scored as this (a weight times it is finite)
LOG_TINY = math.log(torch.finfo(torch.float64).tiny)


def finite_scores(scores: Tensor) -> Tensor:
    """`scores` as float64 with -inf (a probability of 0) raised to `LOG_TINY`."""
    return torch.nan_to_num(scores.double(), nan=math.nan, posinf=math.inf, neginf=LOG_TINY)


def affine(scores: Tensor, weights: Tensor, bias: Tensor) -> Tensor:
    """s W^T + b `[N, C]` (float64) for scores `[N, C]`, W `[C, C]` (or its diagonal `[C]`)."""
    s = finite_scores(scores)
    w, b = weights.to(s), bias.to(s)
    return (s @ w.T if w.ndim == 2 else s * w) + b


def coefficients(
    c: int, full: bool, reg_lambda: float, reg_mu: float, l2: float, like: Tensor
) -> Tensor:
    """Per-entry penalty weights `[C, K]` of θ: λ/(C(C-1)) on the off-diagonal of W (ODIR),
    μ/C on b, and l2/(C(C+1)) on every entry of W and b."""
    lam, mu, ridge = reg_lambda / max(c * (c - 1), 1), reg_mu / c, l2 / (c * (c + 1))
    if full:
        off = 1 - torch.eye(c, dtype=like.dtype, device=like.device)
        weights = lam * off + ridge
    else:
        weights = torch.full((c, 1), ridge, dtype=like.dtype, device=like.device)
    bias = torch.full((c, 1), mu + ridge, dtype=like.dtype, device=like.device)
    return torch.cat([weights, bias], 1)


def live_rows(y: Tensor, c: int, like: Tensor) -> Tensor:
    """`[C, 1]`: 1.0 for the classes in the labels `y`, 0.0 for the others."""
    live = torch.zeros(c, 1, dtype=like.dtype, device=like.device)
    live[y] = 1.0
    return live


def temperature_map(c: int, temperature: float, full: bool, like: Tensor) -> Tensor:
    """θ `[C, K]` of temperature scaling: W = I / T (its diagonal for a diagonal map), b = 0."""
    diagonal = torch.cat([like.new_full((c, 1), 1.0 / temperature), like.new_zeros(c, 1)], 1)
    return embed(diagonal) if full else diagonal


def embed(diagonal: Tensor) -> Tensor:
    """A diagonal map's θ `[C, 2]` as a full map's `[C, C + 1]` (`diagonal_of`'s inverse)."""
    return torch.cat([torch.diag(diagonal[:, 0]), diagonal[:, 1:]], 1)


def diagonal_of(theta: Tensor) -> Tensor:
    """A full map's θ `[C, C + 1]` reduced to its diagonal map `[C, 2]`."""
    return torch.stack([theta[:, :-1].diagonal(), theta[:, -1]], 1)


def diagonal_part(pen: Penalty) -> Penalty:
    """A full map's penalty `[C, C + 1]` restricted to W's diagonal and b `[C, 2]`."""
    centre = torch.as_tensor(pen.centre).to(pen.coef).expand_as(pen.coef)
    live = pen.live if pen.live.shape[1] == 1 else diagonal_of(pen.live)
    return Penalty(diagonal_of(pen.coef), diagonal_of(centre), live)


def fit_affine(
    scores: Tensor,
    y: Tensor,
    *,
    full: bool,
    reg_lambda: float = 0.0,
    reg_mu: float = 0.0,
    l2: float = 0.0,
    max_iter: int = 200,
) -> tuple[Tensor, Tensor]:
    """argmin_{W, b} NLL(softmax(s W^T + b), y) + penalty, for scores `[N, C]`, labels `[N]`:
    W `[C, C]` (`full`) or its diagonal `[C]`, b `[C]`, float64, with the fixed ODIR / L2
    strengths of Kull et al. (centre 0; see the module doc). Rows with a NaN or +inf score
    are left out; `max_iter` bounds the iterations (unregularised matrix scaling of separable
    data has no finite optimum: it stops there)."""
    s, y = usable(scores, y)
    c = s.shape[1]
    coef = coefficients(c, full, reg_lambda, reg_mu, l2, s)
    pen = Penalty(coef, torch.zeros((), dtype=s.dtype, device=s.device), live_rows(y, c, s))
    start = temperature_map(c, fit_temperature(s, y, label=None), full, s)
    if full and start.numel() > solvers.NEWTON_MAX:  # the best diagonal map first: cheap, and close
        diagonal = diagonal_part(pen)
        start = embed(solvers._newton_cg(diagonal_of(start), s, y, diagonal, False, max_iter))
    return unpack(minimise(start, s, y, pen, full, max_iter), full)


def usable(scores: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """(float64 scores `[N', C]`, labels `[N']`) without the rows holding NaN or +inf."""
    s = finite_scores(scores.detach())
    keep = ~(torch.isnan(s) | torch.isposinf(s)).any(-1)
    return s[keep], y[keep].long()


def unpack(theta: Tensor, full: bool) -> tuple[Tensor, Tensor]:
    """(W, b) from a fitted θ; a FloatingPointError where it is not finite."""
    if not torch.isfinite(theta).all():
        raise FloatingPointError("calibration map diverged (non-finite weights)")
    weights, bias = split(theta.detach(), full)
    return weights.contiguous(), bias.contiguous()
