"""Fitting an affine map of scores, s ↦ s W^T + b, on NLL plus the penalties of Kull et al. 2019
(what vector / matrix scaling and Dirichlet calibration share; `peg.methods.scaling`).

The parameters are θ `[C, K]`: for a full W, θ = [W | b] (K = C + 1, acting on x = [s, 1]); for
a diagonal W (vector scaling), row c is (w_c, b_c) (K = 2, acting on (s_c, 1)). The penalty is
Σ coef ⊙ θ², the per-entry weights `coefficients` gives (ODIR and L2 as means over the entries
they cover, as in the paper).

Two deterministic float64 optimisers, both from the identity map (W = I, b = 0):
- Newton's method with the exact Hessian and a backtracking line search, when θ has at most
  `NEWTON_MAX` entries (a full W up to C = 34, a diagonal one up to C = 600) and forming the
  Hessian costs at most `NEWTON_FLOPS` (N P²: C = 10 up to N = 165k): it converges in about
  ten iterations whatever the conditioning (log p̄ spans tens of nats, and the scores of
  different classes are nearly collinear through their shared log-normaliser);
- L-BFGS otherwise (the Hessian would be too large or too slow to form), preconditioned by
  an average block of the Hessian (`_preconditioner`) and with the penalty taken at its
  minimum over the maps that predict alike (`_preferred`): slower, bounded by `max_iter`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

NEWTON_MAX = 1200  # parameters up to which the Hessian `[P, P]` is formed...
NEWTON_FLOPS = 2e9  # ... and N P², what forming it costs, up to which Newton is faster
# log of the smallest positive float64: a probability that underflowed to 0 (log p̄ = -inf) is
# scored as this, so a weight times it stays finite
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


def split(theta: Tensor, full: bool) -> tuple[Tensor, Tensor]:
    """(W `[C, C]` or `[C]`, b `[C]`) from θ."""
    return (theta[:, :-1], theta[:, -1]) if full else (theta[:, 0], theta[:, 1])


def _logits(theta: Tensor, s: Tensor, full: bool) -> Tensor:
    return affine(s, *split(theta, full))


def _value(theta: Tensor, s: Tensor, y: Tensor, coef: Tensor, full: bool) -> Tensor:
    return F.cross_entropy(_logits(theta, s, full), y) + (coef * theta.square()).sum()


def _gradient(theta: Tensor, s: Tensor, y: Tensor, coef: Tensor, full: bool) -> tuple[Tensor, ...]:
    """(value, gradient `[C, K]`, probabilities `[N, C]`) of the objective at θ."""
    log_p = _logits(theta, s, full).log_softmax(-1)
    value = -log_p.gather(1, y[:, None]).mean() + (coef * theta.square()).sum()
    p = log_p.exp()
    r = p.clone()
    r[torch.arange(len(y)), y] -= 1
    r /= len(y)
    grad = (
        torch.cat([r.T @ s, r.sum(0)[:, None]], 1)
        if full
        else torch.stack([(r * s).sum(0), r.sum(0)], 1)
    )
    return value, grad + 2 * coef * theta, p


def _hessian(p: Tensor, s: Tensor, coef: Tensor, full: bool) -> Tensor:
    """The exact Hessian `[P, P]` of the objective (θ flattened row-major): Σ_n (diag(p_n) -
    p_n p_n^T) ⊗ x_n x_n^T / N for a full W (block-diagonal entries per class for a diagonal
    one), plus the penalty's 2 coef on the diagonal."""
    n, c = p.shape
    ones = torch.ones_like(s[:, :1])
    if full:
        x = torch.cat([s, ones], 1)
        pv = p[:, :, None] * x[:, None, :]  # [N, C, K]
        blocks = (pv.reshape(n, -1).T @ x).reshape(c, -1, x.shape[1])  # Σ_n p_nc x_n x_n^T
    else:
        phi = torch.stack([s, ones.expand_as(s)], -1)  # [N, C, 2]
        pv = p[:, :, None] * phi
        blocks = torch.einsum("nck,ncj->ckj", pv, phi)
    v = pv.reshape(n, -1)
    k = blocks.shape[-1]
    h = -(v.T @ v)
    h.view(c, k, c, k)[torch.arange(c), :, torch.arange(c), :] += blocks
    h /= n
    h.diagonal().add_(2 * coef.reshape(-1))
    return h


def _newton(theta: Tensor, s: Tensor, y: Tensor, coef: Tensor, full: bool, max_iter: int) -> Tensor:
    value, grad, p = _gradient(theta, s, y, coef, full)
    for _ in range(max_iter):
        if float(grad.abs().max()) <= 1e-10:
            break
        h = _hessian(p, s, coef, full)
        # a ridge far below the curvature: the directions softmax ignores (a constant added to
        # every class) are flat without a penalty, and the gradient has no part along them
        h.diagonal().add_(1e-10 * float(h.diagonal().abs().max()) + 1e-300)
        step = torch.linalg.solve(h, grad.reshape(-1)).reshape(theta.shape)
        slope = float((grad * step).sum())
        t, improved = 1.0, False
        while t > 1e-10:
            trial = theta - t * step
            new = _value(trial, s, y, coef, full)
            if float(new) <= float(value) - 1e-4 * t * slope:
                improved = True
                break
            t /= 2
        if not improved:
            break
        gain = float(value - new)
        theta = trial
        value, grad, p = _gradient(theta, s, y, coef, full)
        if gain <= 1e-15 * max(1.0, abs(float(value))):
            break
    return theta


def _preferred(theta: Tensor, coef: Tensor, full: bool) -> Tensor:
    """Of the maps predicting as θ does, the one the penalty is least on: softmax ignores a
    constant added to every class, so (W - 1 v^T, b - c 1) predicts as (W, b) for any v, c,
    and the penalty's minimum over them is a weighted mean (closed form)."""
    weights, bias = split(theta, full)
    cw, cb = split(coef, full)
    if full:
        total = cw.sum(0)
        shift = torch.where(total > 0, (cw * weights).sum(0) / total.clamp_min(1e-300), 0.0)
        weights = weights - shift
    total = cb.sum()
    if float(total) > 0:
        bias = bias - (cb * bias).sum() / total
    return torch.cat([weights, bias[:, None]], 1) if full else torch.stack([weights, bias], 1)


def _preconditioner(theta: Tensor, s: Tensor, coef: Tensor, full: bool) -> Tensor:
    """A factor L `[K, K]` with L L^T ≈ the Hessian's block of one class row of θ at the
    start: a E[x x^T] + 2 diag(coef), a = E[p (1 - p)] (the rows' blocks, averaged): L-BFGS
    runs in φ = θ L, where the NLL (log p̄ spans tens of nats, the classes' scores are nearly
    collinear through their shared log-normaliser) and the penalty are alike conditioned."""
    p = _logits(theta, s, full).softmax(-1)
    a = float((p * (1 - p)).mean())
    if full:
        x = torch.cat([s, torch.ones_like(s[:, :1])], 1)
        second = x.T @ x / len(s)
    else:
        second = torch.stack(
            [torch.stack([s.square().mean(), s.mean()]), torch.stack([s.mean(), s.new_ones(())])]
        )
    m = a * second + torch.diag(2 * coef.mean(0))
    m.diagonal().add_(1e-10 * float(m.diagonal().abs().max()) + 1e-300)
    factor, info = torch.linalg.cholesky_ex(m)
    return factor if int(info) == 0 else torch.eye(len(m), dtype=s.dtype, device=s.device)


def _lbfgs(theta: Tensor, s: Tensor, y: Tensor, coef: Tensor, full: bool, max_iter: int) -> Tensor:
    """L-BFGS in preconditioned coordinates (`_preconditioner`), the penalty at `_preferred`
    (the directions only the penalty curves are flat there, not nearly flat)."""
    factor = _preconditioner(theta, s, coef, full)
    inverse = torch.linalg.inv(factor)
    phi = (theta @ factor).contiguous().requires_grad_()
    opt = torch.optim.LBFGS(
        [phi],
        max_iter=max_iter,
        tolerance_grad=1e-10,
        tolerance_change=1e-15,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> Tensor:
        opt.zero_grad()
        loss = _value(_preferred(phi @ inverse, coef, full), s, y, coef, full)
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        return _preferred(phi @ inverse, coef, full)


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
    W `[C, C]` (`full`) or its diagonal `[C]`, b `[C]`, float64 (see the module doc). Rows with
    a NaN or +inf score are left out; `max_iter` bounds the iterations (unregularised matrix
    scaling of separable data has no finite optimum: it stops there)."""
    s = finite_scores(scores.detach())
    keep = ~(torch.isnan(s) | torch.isposinf(s)).any(-1)
    s, y = s[keep], y[keep].long()
    c = s.shape[1]
    coef = coefficients(c, full, reg_lambda, reg_mu, l2, s)
    eye = torch.eye(c, dtype=s.dtype, device=s.device)
    zero = torch.zeros_like(eye[:, :1])
    theta = torch.cat([eye, zero], 1) if full else torch.cat([torch.ones_like(zero), zero], 1)
    size = theta.numel()
    fit = _newton if size <= NEWTON_MAX and len(s) * size**2 <= NEWTON_FLOPS else _lbfgs
    theta = fit(theta, s, y, coef, full, max_iter)
    if not torch.isfinite(theta).all():
        raise FloatingPointError("calibration map diverged (non-finite weights)")
    weights, bias = split(theta.detach(), full)
    return weights.contiguous(), bias.contiguous()
