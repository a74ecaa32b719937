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
- truncated Newton otherwise (the Hessian would be too large or too slow to form, e.g. 1000
  classes): conjugate gradients on exact Hessian-vector products (`_newton_cg`), a full W
  started from the best diagonal one (`_diagonal_start`). At C = 1000 a diagonal map's step
  costs a few passes over the `[N, C]` scores (L-BFGS, which learnt the curvature from
  gradients, took ~30 × temperature scaling's time: issue 31).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from peg.methods.temperature import fit_temperature

NEWTON_MAX = 1200  # parameters up to which the Hessian `[P, P]` is formed...
NEWTON_FLOPS = 2e9  # ... and N P², what forming it costs, up to which Newton is faster
# truncated Newton (larger maps): CG steps per Newton step at most, and the predicted decrease
# of the objective (nats a point, relative above 1) below which it stops: far below any
# standard error of a validation NLL
CG_STEPS = 50
DECREMENT_TOL = 1e-10
GAIN_TOL = 1e-5  # ... and the decrease of a step (relative above 1) at which a crawl stops
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


def _backtrack(
    theta: Tensor, step: Tensor, slope: float, value: Tensor, s: Tensor, y: Tensor,
    coef: Tensor, full: bool,
) -> tuple[Tensor, Tensor] | None:  # fmt: skip
    """(θ − t·step, its objective) for the first t = 1, 1/2, ... meeting Armijo's condition
    (a decrease of at least 1e-4·t·slope); None when no t > 1e-10 does."""
    t = 1.0
    while t > 1e-10:
        trial = theta - t * step
        new = _value(trial, s, y, coef, full)
        if float(new) <= float(value) - 1e-4 * t * slope:
            return trial, new
        t /= 2
    return None


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
        found = _backtrack(theta, step, slope, value, s, y, coef, full)
        if found is None:
            break
        trial, new = found
        gain = float(value - new)
        theta = trial
        value, grad, p = _gradient(theta, s, y, coef, full)
        if gain <= 1e-15 * max(1.0, abs(float(value))):
            break
    return theta


Linear = Callable[[Tensor], Tensor]


def _curvature(
    p: Tensor, s: Tensor, coef: Tensor, full: bool, basis: tuple[Tensor, Tensor] | None = None
) -> tuple[Linear, Linear]:
    """(v ↦ H v, r ↦ M⁻¹ r) at probabilities p: Hessian-vector products without forming H,
    and CG's preconditioner M, H's blocks without the coupling of the classes.

    The logits are linear in θ, so H = Jᵀ (diag(p) - p pᵀ) J / N + 2 diag(coef), J the map's
    Jacobian. For a full W, H v costs two products with the scores and M is a_c E[x xᵀ] + κ I
    for class row c (x = [s, 1]; `basis`: E[x xᵀ]'s eigenvalues and eigenvectors). For
    a diagonal W, H = D - Vᵀ V / N with D block-diagonal (class c's 2 × 2 block of (w_c, b_c):
    Σ_n p_nc φ φᵀ, φ = (s_nc, 1)) and V = [p ⊙ s, p] `[N, 2C]`: H v is four passes over
    `[N, C]` (matrix-vector products, nothing written), and M is D's and VᵀV's 2 × 2 blocks,
    inverted in closed form (w_c and b_c are strongly coupled through the scores' mean)."""
    n = len(s)
    if full:

        def hvp_full(v: Tensor) -> Tensor:
            u = s @ v[:, :-1].T + v[:, -1]  # J v, [N, C]
            r = p * (u - (p * u).sum(1, keepdim=True)) / n
            return torch.cat([r.T @ s, r.sum(0)[:, None]], 1) + 2 * coef * v

        # M = a_c E[x xᵀ] + κ I per class row c (a_c = mean p_c(1 - p_c), κ the mean penalty):
        # the scores' columns are strongly correlated (log p̄ shares the log-normaliser), which
        # a diagonal misses; inverted through E[x xᵀ]'s eigenvectors (`basis`), two products
        lam, Q = basis  # type: ignore[misc]
        a = (p * (1 - p)).mean(0)
        inverse = 1.0 / (a[:, None] * lam[None, :] + float(2 * coef.mean()) + 1e-300)
        return hvp_full, lambda r: ((r @ Q) * inverse) @ Q.T
    ps = p * s
    pss, pc, pc2 = (ps * s).sum(0) / n, p.sum(0) / n, p.square().sum(0) / n
    psum, ps2, pps = ps.sum(0) / n, ps.square().sum(0) / n, (ps * p).sum(0) / n

    def hvp(v: Tensor) -> Tensor:
        t = (ps @ v[:, 0] + p @ v[:, 1]) / n  # V v / N, [N]
        w = pss * v[:, 0] + psum * v[:, 1] - ps.T @ t
        b = psum * v[:, 0] + pc * v[:, 1] - p.T @ t
        return torch.stack([w, b], 1) + 2 * coef * v

    a = pss - ps2 + 2 * coef[:, 0]
    b = psum - pps
    c = pc - pc2 + 2 * coef[:, 1]
    ridge = 1e-10 * float(torch.maximum(a, c).max()) + 1e-300
    a, c = a + ridge, c + ridge
    det = (a * c - b.square()).clamp_min(ridge * ridge)

    def precondition(r: Tensor) -> Tensor:
        return torch.stack([c * r[:, 0] - b * r[:, 1], a * r[:, 1] - b * r[:, 0]], 1) / det[:, None]

    return hvp, precondition


def _cg(hvp: Linear, precondition: Linear, b: Tensor, tol: float, steps: int) -> Tensor:
    """x ≈ H⁻¹ b by preconditioned conjugate gradients (H ⪰ 0)."""
    x = torch.zeros_like(b)
    r = b.clone()
    z = precondition(r)
    d = z.clone()
    rz = float((r * z).sum())
    for _ in range(steps):
        hd = hvp(d)
        curv = float((d * hd).sum())
        if curv <= 0:  # a flat direction (softmax's invariance, no penalty): stop there
            break
        a = rz / curv
        x += a * d
        r -= a * hd
        if float(r.norm()) <= tol:
            break
        z = precondition(r)
        rz, old = float((r * z).sum()), rz
        d = z + (rz / old) * d
    return x


def _newton_cg(
    theta: Tensor, s: Tensor, y: Tensor, coef: Tensor, full: bool, max_iter: int
) -> Tensor:
    """Truncated Newton: each step solves H step = ∇ by preconditioned CG on Hessian-vector
    products (`_hvp`: O(N C) a product for a diagonal W, two N×C×C products for a full one),
    to a relative accuracy min(0.5, √‖∇‖) (superlinear near the optimum), then a backtracking
    line search. Exact curvature where L-BFGS would have to learn it from gradients."""
    value, grad, p = _gradient(theta, s, y, coef, full)
    gain = math.inf
    basis = None
    if full:
        x = torch.cat([s, torch.ones_like(s[:, :1])], 1)
        basis = torch.linalg.eigh(x.T @ x / len(s))
        basis = (basis[0].clamp_min(0), basis[1])
    for _ in range(max_iter):
        gnorm = float(grad.norm())
        if float(grad.abs().max()) <= 1e-10:
            break
        tol = min(0.5, gnorm**0.5) * gnorm
        step = _cg(*_curvature(p, s, coef, full, basis), grad, tol, CG_STEPS)
        slope = float((grad * step).sum())
        if not slope > 0:
            break
        found = _backtrack(theta, step, slope, value, s, y, coef, full)
        if found is None:
            break
        trial, new = found
        theta = trial
        gain, last = float(value - new), gain
        if gain <= GAIN_TOL * max(1.0, abs(float(value))) and gain > 0.1 * last:
            break  # an objective without a finite minimum (a class absent from the labels, or
            # separable data, unregularised) creeps down forever: stop where it no longer moves
            # (converging, each gain is far below the last)
        # Newton's predicted decrease (the decrement, slope / 2) of the step just taken: below
        # the tolerance, what is left is smaller still (quadratic convergence): done
        if slope <= 2 * DECREMENT_TOL * max(1.0, abs(float(value))):
            break
        value, grad, p = _gradient(theta, s, y, coef, full)
    return theta


def _temperature_start(s: Tensor, y: Tensor) -> Tensor:
    """A diagonal map's start `[C, 2]`: temperature scaling's (w = 1/T, b = 0; one
    parameter, a few passes). From the identity, the classes the model is sure of have almost
    no curvature and Newton's first steps overshoot (line searches cut them 30- to 100-fold)."""
    w = 1.0 / fit_temperature(s, y)
    return torch.cat([torch.full_like(s[0, :, None], w), torch.zeros_like(s[0, :, None])], 1)


def _diagonal_start(s: Tensor, y: Tensor, coef: Tensor, max_iter: int) -> Tensor:
    """A full map's start: the best diagonal map under the same penalty on its entries (W's
    diagonal and b; cheap), embedded in θ `[C, C + 1]`; ODIR pulls the full map towards it."""
    diag_coef = torch.stack([coef[:, :-1].diagonal(), coef[:, -1]], 1)
    d = _newton_cg(_temperature_start(s, y), s, y, diag_coef, False, max_iter)
    return torch.cat([torch.diag(d[:, 0]), d[:, 1:]], 1)


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
    if size <= NEWTON_MAX and len(s) * size**2 <= NEWTON_FLOPS:
        theta = _newton(theta, s, y, coef, full, max_iter)
    else:
        theta = _diagonal_start(s, y, coef, max_iter) if full else _temperature_start(s, y)
        theta = _newton_cg(theta, s, y, coef, full, max_iter)
    if not torch.isfinite(theta).all():
        raise FloatingPointError("calibration map diverged (non-finite weights)")
    weights, bias = split(theta.detach(), full)
    return weights.contiguous(), bias.contiguous()
