"""Minimising NLL + penalty over an affine map θ `[C, K]` of scores: the objective, its
gradient and exact curvature, and two float64 optimisers (`peg.methods.calibration._affine`
holds the maps, the penalties' weights and the fit that calls them):
- Newton's method with the exact Hessian and a backtracking line search, when θ has at most
  `NEWTON_MAX` entries (a full W up to C = 34; a diagonal one up to C = 20,
  `DIAGONAL_NEWTON_MAX`) and forming the Hessian costs at most `NEWTON_FLOPS` (N P²: C = 10
  up to N = 165k);
- truncated Newton otherwise (e.g. 1000 classes): conjugate gradients on exact Hessian-vector
  products (`_newton_cg`). At C = 1000 a diagonal map's step costs a few passes over the
  `[N, C]` scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

NEWTON_MAX = 1200  # parameters up to which the Hessian `[P, P]` is formed...
NEWTON_FLOPS = 2e9  # ... and N P², what forming it costs, up to which Newton is faster
# a diagonal map's: beyond C = 20 truncated Newton's O(N C) products beat the dense [2C, 2C]
# Hessian (the same map; CPU seconds of vector scaling's default fit on 4,000 points: 0.36
# against 0.65 at 100 classes, 1.4 against 4.1 at 300, equal at 20; Newton's 0.125 against
# 0.141 at 10)
DIAGONAL_NEWTON_MAX = 40
# CG steps per truncated Newton step at most; the predicted decrease (nats, relative above 1)
CG_STEPS = 50
DECREMENT_TOL = 1e-10  # below which it stops: far below any SE of a validation NLL
GAIN_TOL = 1e-5  # ... and the decrease of a step (relative above 1) at which a crawl stops


class Penalty(NamedTuple):
    """Σ coef ⊙ (θ - centre)², on the entries `live` `[C, 1]` (whole rows) or `[C, K]` (1.0;
    0.0: held where it starts: the row of a class absent from the labels, an entry of
    infinite strength in `peg.methods.calibration._affine_select`). Held, not penalised: a
    weight of 1e12 made H's diagonal span 1e12 and CG's preconditioner, scaled by the mean
    weight, a multiple of the identity."""

    coef: Tensor  # [C, K]
    centre: Tensor  # [C, K] (or a scalar 0)
    live: Tensor  # [C, 1] or [C, K]

    def value(self, theta: Tensor) -> Tensor:
        return (self.coef * (theta - self.centre).square()).sum()

    def gradient(self, theta: Tensor) -> Tensor:
        return 2 * self.coef * (theta - self.centre)


def split(theta: Tensor, full: bool) -> tuple[Tensor, Tensor]:
    """(W `[C, C]` or `[C]`, b `[C]`) from θ."""
    return (theta[:, :-1], theta[:, -1]) if full else (theta[:, 0], theta[:, 1])


def _log_probs(theta: Tensor, s: Tensor, full: bool) -> Tensor:
    """log softmax(s W^T + b) `[N, C]` for scores already finite (`usable`)."""
    w, b = split(theta, full)
    return ((s @ w.T if full else s * w) + b).log_softmax(-1)


def _value(theta: Tensor, s: Tensor, y: Tensor, pen: Penalty, full: bool) -> tuple[Tensor, Tensor]:
    """(objective at θ, log-probabilities `[N, C]`)."""
    log_p = _log_probs(theta, s, full)
    return -log_p.gather(1, y[:, None]).mean() + pen.value(theta), log_p


def _gradient(
    theta: Tensor, s: Tensor, y: Tensor, pen: Penalty, full: bool,
    known: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, ...]:  # fmt: skip
    """(value, gradient `[C, K]` (0 on the rows held), probabilities `[N, C]`) at θ (`known`:
    `_value`'s there). The labels' part of the gradient, Σ_n x_n e_{y_n}ᵀ, is summed by class
    (no copy of p)."""
    value, log_p = _value(theta, s, y, pen, full) if known is None else known
    p = log_p.exp()
    n, c = p.shape
    counts = torch.bincount(y, minlength=c).to(s.dtype)
    if full:
        target = s.new_zeros(c, c).index_add_(0, y, s)  # [C, C]: Σ_{n: y_n = c} s_n
        grad = torch.cat([p.T @ s - target, (p.sum(0) - counts)[:, None]], 1) / n
    else:
        true = s.gather(1, y[:, None])[:, 0]
        target = s.new_zeros(c).index_add_(0, y, true)
        grad = torch.stack([(p * s).sum(0) - target, p.sum(0) - counts], 1) / n
    return value, (grad + pen.gradient(theta)) * pen.live, p


def _hessian(p: Tensor, s: Tensor, pen: Penalty, full: bool) -> Tensor:
    """The exact Hessian `[P, P]` of the objective (θ flattened row-major): Σ_n (diag(p_n) -
    p_n p_n^T) ⊗ x_n x_n^T / N for a full W (block-diagonal entries per class for a diagonal
    one), plus the penalty's 2 coef on the diagonal; the rows held are the identity's."""
    n, c = p.shape
    ones = torch.ones_like(s[:, :1])
    if full:
        h = _full_curvature(p, torch.cat([s, ones], 1))
    else:
        phi = torch.stack([s, ones.expand_as(s)], -1)  # [N, C, 2]
        pv = p[:, :, None] * phi
        blocks = torch.einsum("nck,ncj->ckj", pv, phi)
        v = pv.reshape(n, -1)
        h = -(v.T @ v)
        h.view(c, 2, c, 2)[torch.arange(c), :, torch.arange(c), :] += blocks
        h /= n
    # a ridge far below the data's curvature: softmax's flat directions (a constant on every
    # class). Not scaled by the penalty's: an entry held by a huge one (k = ∞ in
    # `_affine_select`) made it the free entries' curvature, and Newton a gradient descent
    h.diagonal().add_(1e-10 * float(h.diagonal().abs().max()) + 1e-300 + 2 * pen.coef.reshape(-1))
    held = (pen.live.expand_as(pen.coef).reshape(-1) == 0).nonzero()[:, 0]
    h[held], h[:, held] = 0.0, 0.0
    h[held, held] = 1.0
    return h


def _full_curvature(p: Tensor, x: Tensor) -> Tensor:
    """Σ_n A_n ⊗ x_n x_nᵀ / N `[C K, C K]`, A_n = diag(p_n) - p_n p_nᵀ, for probabilities p
    `[N, C]` and inputs x `[N, K]`. Both factors are symmetric: one product of their upper
    triangles, `[C(C+1)/2, N] @ [N, K(K+1)/2]`, a third of the flops of the `[C K, C K]`
    product of p_n ⊗ x_n (the Newton fits' cost at 10 classes)."""
    (n, c), k = p.shape, x.shape[1]
    cu = torch.triu_indices(c, c, device=p.device)
    ku = torch.triu_indices(k, k, device=p.device)
    pt, xt = p.T.contiguous(), x.T.contiguous()  # rows, not columns, gathered: 3 x faster
    a = -(pt[cu[0]] * pt[cu[1]])  # [C(C+1)/2, N]
    a[cu[0] == cu[1]] += pt  # the pairs (c, c), in order of c
    m = (a @ (xt[ku[0]] * xt[ku[1]]).T) / n

    def pairs(size: int, upper: Tensor) -> Tensor:
        index = torch.empty(size, size, dtype=torch.long, device=p.device)
        index[upper[0], upper[1]] = index[upper[1], upper[0]] = torch.arange(upper.shape[1])
        return index

    pc, pk = pairs(c, cu), pairs(k, ku)
    return m[pc[:, None, :, None], pk[None, :, None, :]].reshape(c * k, c * k)


def _backtrack(
    theta: Tensor, step: Tensor, slope: float, value: Tensor, s: Tensor, y: Tensor,
    pen: Penalty, full: bool,
) -> tuple[Tensor, tuple[Tensor, Tensor]] | None:  # fmt: skip
    """(θ − t·step, its (objective, log-probabilities)) for the first t = 1, 1/2, ... meeting
    Armijo's condition (a decrease of at least 1e-4·t·slope); None when no t > 1e-10 does."""
    t = 1.0
    while t > 1e-10:
        trial = theta - t * step
        new = _value(trial, s, y, pen, full)
        if float(new[0]) <= float(value) - 1e-4 * t * slope:
            return trial, new
        t /= 2
    return None


def _newton(
    theta: Tensor, s: Tensor, y: Tensor, pen: Penalty, full: bool, max_iter: int, tol: float
) -> Tensor:
    value, grad, p = _gradient(theta, s, y, pen, full)
    for _ in range(max_iter):
        if float(grad.abs().max()) <= 1e-10:
            break
        h = _hessian(p, s, pen, full)
        step = torch.linalg.solve(h, grad.reshape(-1)).reshape(theta.shape)
        slope = float((grad * step).sum())
        found = _backtrack(theta, step, slope, value, s, y, pen, full)
        if found is None:
            break
        theta, new = found
        gain = float(value - new[0])
        value, grad, p = _gradient(theta, s, y, pen, full, new)
        scale = max(1.0, abs(float(value)))
        if gain <= 1e-15 * scale or slope <= 2 * tol * scale:  # tol 0: to the float64 floor
            break
    return theta


Linear = Callable[[Tensor], Tensor]


def _curvature(
    p: Tensor, s: Tensor, pen: Penalty, full: bool, basis: tuple[Tensor, Tensor] | None = None
) -> tuple[Linear, Linear]:
    """(v ↦ H v, r ↦ M⁻¹ r) at probabilities p: Hessian-vector products without forming H,
    and CG's preconditioner M, H's blocks without the coupling of the classes.

    The logits are linear in θ, so H = Jᵀ (diag(p) - p pᵀ) J / N + 2 diag(coef), J the map's
    Jacobian. For a full W, H v costs two products with the scores and M is a_c E[x xᵀ] + κ I
    for class row c (x = [s, 1]; `basis`: E[x xᵀ]'s eigenvalues and eigenvectors). For
    a diagonal W, H = D - Vᵀ V / N with D block-diagonal (class c's 2 × 2 block of (w_c, b_c):
    Σ_n p_nc φ φᵀ, φ = (s_nc, 1)) and V = [p ⊙ s, p] `[N, 2C]`: H v is four passes over
    `[N, C]` (matrix-vector products, nothing written), and M is D's and VᵀV's 2 × 2 blocks,
    inverted in closed form (w_c and b_c are strongly coupled through the scores' mean). Both
    are 0 on the rows held (`pen.live`), so CG leaves them where they are."""
    n, coef, live = len(s), pen.coef, pen.live
    if full:
        # float32 halves the two N×C×C products' time; CG's directions need no more (the
        # gradient, the objective and the line search stay float64)
        s32, p32 = s.float(), p.float()

        def hvp_full(v: Tensor) -> Tensor:
            u = s32 @ v[:, :-1].T.float() + v[:, -1].float()  # J v, [N, C]
            r = p32 * (u - (p32 * u).sum(1, keepdim=True)) / n
            out = torch.cat([r.T @ s32, r.sum(0)[:, None]], 1).to(v)
            return (out + 2 * coef * v) * live

        # M = a_c E[x xᵀ] + κ I per row c (a_c = mean p_c(1 - p_c), κ the mean penalty): the
        # scores' columns correlate (log p̄'s shared normaliser); inverted by `basis`
        lam, Q = basis if basis is not None else score_basis(s)  # `_newton_cg` passes it
        a = (p * (1 - p)).mean(0)
        # κ over the entries free (not those held, whose weight is 0), and at least a sliver
        # of the largest curvature: M stays invertible where E[x xᵀ] is not (N < C) and
        # nothing is penalised
        free = live.expand_as(coef)
        kappa = float(2 * (coef * free).sum() / free.sum().clamp_min(1))
        kappa = max(kappa, 1e-8 * float(a.max()) * float(lam.max())) + 1e-300
        inverse = 1.0 / (a[:, None] * lam[None, :] + kappa)
        if Q.shape[1] == Q.shape[0]:
            return hvp_full, lambda r: (((r @ Q) * inverse) @ Q.T) * live
        inverse -= 1.0 / kappa  # E[x xᵀ] of low rank (`score_basis`): κ alone off its span

        def precondition_low_rank(r: Tensor) -> Tensor:
            return (r / kappa + ((r @ Q) * inverse) @ Q.T) * live

        return hvp_full, precondition_low_rank
    ps = p * s
    pss, pc, pc2 = (ps * s).sum(0) / n, p.sum(0) / n, p.square().sum(0) / n
    psum, ps2, pps = ps.sum(0) / n, ps.square().sum(0) / n, (ps * p).sum(0) / n

    def hvp(v: Tensor) -> Tensor:
        t = (ps @ v[:, 0] + p @ v[:, 1]) / n  # V v / N, [N]
        w = pss * v[:, 0] + psum * v[:, 1] - ps.T @ t
        b = psum * v[:, 0] + pc * v[:, 1] - p.T @ t
        return (torch.stack([w, b], 1) + 2 * coef * v) * live

    a, b, c = pss - ps2, psum - pps, pc - pc2
    ridge = 1e-10 * float(torch.maximum(a, c).max()) + 1e-300  # of the data's, as `_hessian`
    a, c = a + 2 * coef[:, 0] + ridge, c + 2 * coef[:, 1] + ridge
    det = (a * c - b.square()).clamp_min(ridge * ridge)

    def precondition(r: Tensor) -> Tensor:
        step = torch.stack([c * r[:, 0] - b * r[:, 1], a * r[:, 1] - b * r[:, 0]], 1)
        return step / det[:, None] * live

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


def score_basis(s: Tensor) -> tuple[Tensor, Tensor]:
    """E[x xᵀ]'s eigenvalues and eigenvectors, x = [s, 1] `[N, C + 1]`: the full map's
    preconditioner (`_curvature`), the same for every fit on these scores."""
    x = torch.cat([s, torch.ones_like(s[:, :1])], 1)
    lam, q = torch.linalg.eigh(x.T @ x / len(s))
    # with fewer points than columns (N < C + 1) only the N largest are not 0: the rest
    # of the space is κ's alone, and the preconditioner's products shrink by (C + 1) / N
    kept = lam > 1e-10 * float(lam.max())
    kept[-1] = True
    return lam[kept].clamp_min(0), q[:, kept]


def _newton_cg(
    theta: Tensor, s: Tensor, y: Tensor, pen: Penalty, full: bool, max_iter: int,
    basis: tuple[Tensor, Tensor] | None = None, tol: float = DECREMENT_TOL,
) -> Tensor:  # fmt: skip
    """Truncated Newton: each step solves H step = ∇ by preconditioned CG on Hessian-vector
    products (`_hvp`: O(N C) a product for a diagonal W, two N×C×C products for a full one),
    to a relative accuracy min(0.5, √‖∇‖) (superlinear near the optimum), then a backtracking
    line search. Exact curvature where L-BFGS would have to learn it from gradients."""
    value, grad, p = _gradient(theta, s, y, pen, full)
    gain, crawl = math.inf, 0
    if full and basis is None:
        basis = score_basis(s)
    for _ in range(max_iter):
        gnorm = float(grad.norm())
        if float(grad.abs().max()) <= 1e-10:
            break
        accuracy = min(0.5, gnorm**0.5) * gnorm
        step = _cg(*_curvature(p, s, pen, full, basis), grad, accuracy, CG_STEPS)
        slope = float((grad * step).sum())
        if not slope > 0:
            break
        found = _backtrack(theta, step, slope, value, s, y, pen, full)
        if found is None:
            break
        theta, new = found
        gain, last = float(value - new[0]), gain
        # no finite minimum (separable data, unregularised): three small gains, none far below
        # the last (converging, each is), and it stops
        small = gain <= GAIN_TOL * max(1.0, abs(float(value))) and gain > 0.1 * last
        crawl = crawl + 1 if small else 0
        if crawl >= 3:
            break
        # Newton's predicted decrease (slope / 2) below the tolerance: what is left is smaller
        if slope <= 2 * tol * max(1.0, abs(float(value))):
            break
        value, grad, p = _gradient(theta, s, y, pen, full, new)
    return theta


def minimise(
    theta: Tensor, s: Tensor, y: Tensor, pen: Penalty, full: bool, max_iter: int,
    basis: tuple[Tensor, Tensor] | None = None, tol: float = DECREMENT_TOL,
) -> Tensor:  # fmt: skip
    """The map θ `[C, K]` minimising NLL + penalty from θ: Newton's method where the Hessian
    is small and cheap to form, truncated Newton otherwise (see the module doc)."""
    size = theta.numel()
    limit = NEWTON_MAX if full else min(NEWTON_MAX, DIAGONAL_NEWTON_MAX)
    if size <= limit and len(s) * size**2 <= NEWTON_FLOPS:
        return _newton(theta, s, y, pen, full, max_iter, tol if tol > DECREMENT_TOL else 0.0)
    return _newton_cg(theta, s, y, pen, full, max_iter, basis, tol)
