"""Fitting one monotone piecewise-linear function g applied element-wise to scores `[N, C]`
on NLL (`peg.OrderPreservingScaling`, `peg.methods.calibration.order_preserving`).

g has knots t_0 < ... < t_{K-1} and P = K + 1 slopes β > 0: piece 0 is (-∞, t_0), piece j
(1 ≤ j < K) is [t_{j-1}, t_j), piece K is [t_{K-1}, ∞); g(t_0) = 0. It is linear in β,
g(s) = Σ_j β_j φ_j(s), with φ_0(s) = min(s - t_0, 0), and for j ≥ 1 φ_j(s) = the length of
[t_{j-1}, s] inside piece j (w_j = t_j - t_{j-1} when s lies beyond it). The NLL of
softmax(g(s)) is then a multinomial logit in β, convex: `fit_slopes` runs Newton's method on β
with the exact gradient and Hessian, mean_i (E_p[φ] - φ(s_iy)) and mean_i Cov_p[φ], formed
from three per-row sums per piece (Σ p, Σ p·o, Σ p·o², o the offset of a score in its piece):
a few passes over `[N, C]` per iteration, as temperature scaling's Newton steps.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from peg.methods.calibration._affine import finite_scores

SAMPLE = 1_000_000  # scores whose quantiles place the knots, at most (a strided subsample)


def place_knots(s: Tensor, n_knots: int) -> Tensor:
    """Knots `[<= n_knots]`, half at quantiles of all scores, half at quantiles of each row's
    largest, merged; ties (saturated scores) leave fewer."""
    flat = s.reshape(-1)
    stride = max(1, flat.numel() // SAMPLE)
    bulk, top = flat[::stride].cpu().numpy(), s.max(-1).values.cpu().numpy()
    half = n_knots // 2
    found = [
        np.quantile(x, np.linspace(0, 1, k))
        for x, k in ((bulk, n_knots - half), (top, half))
        if k > 0
    ]
    return torch.from_numpy(np.unique(np.concatenate(found))).to(s)


def pieces(s: Tensor, knots: Tensor) -> tuple[Tensor, Tensor]:
    """The piece `[N, C]` of each score and its offset o from the piece's anchor (t_0 for
    pieces 0 and 1, t_{j-1} for piece j)."""
    idx = torch.searchsorted(knots, s.contiguous(), right=True)
    anchor = torch.cat([knots[:1], knots])
    return idx, s - anchor[idx]


def evaluate(idx: Tensor, offset: Tensor, knots: Tensor, slopes: Tensor) -> Tensor:
    """g at the scores given by their pieces and offsets."""
    rise = slopes[1:-1] * knots.diff()  # g's increase over each inner piece
    base = torch.cat([slopes.new_zeros(2), rise.cumsum(0)])  # g at each piece's anchor
    return base[idx] + slopes[idx] * offset


def monotone_map(scores: Tensor, knots: Tensor, slopes: Tensor) -> Tensor:
    """g(s) `[N, C]` (float64) for `knots` `[K]` (increasing) and `slopes` `[K + 1]` (> 0)."""
    s = finite_scores(scores)
    t = knots.to(s)
    return evaluate(*pieces(s, t), t, slopes.to(s))


def _widths(knots: Tensor) -> Tensor:
    """w_j `[P]`: 0 for pieces 0 and K (their φ is the offset alone), t_j - t_{j-1} between."""
    return torch.cat([knots.new_zeros(1), knots.diff(), knots.new_zeros(1)])


def _label_features(idx: Tensor, offset: Tensor, widths: Tensor) -> Tensor:
    """φ `[N, P]` of one score per row (piece `idx` `[N]`, offset `[N]`)."""
    j = torch.arange(len(widths), device=idx.device)
    full = (j[None, :] < idx[:, None]) & (j[None, :] >= 1)
    phi = torch.where(full, widths[None, :], torch.zeros_like(widths)[None, :])
    return phi.scatter(1, idx[:, None], offset[:, None])


def _moments(p: Tensor, idx: Tensor, offset: Tensor, widths: Tensor) -> tuple[Tensor, Tensor]:
    """E_p[φ] `[N, P]` and E_p[φ φ^T] `[N, P, P]` per row, from the sums per piece of p, p·o
    and p·o² (an entry of piece m has φ_j = w_j for 1 ≤ j < m and φ_m = o)."""
    n, size = p.shape[0], len(widths)
    sums = [
        p.new_zeros(n, size).scatter_add_(1, idx, p * offset**k) for k in range(3)
    ]  # Σ p, Σ p o, Σ p o² per piece
    above = sums[0].flip(1).cumsum(1).flip(1) - sums[0]  # mass of the pieces beyond j
    mean = widths * above + sums[1]
    mean[:, 0] = sums[1][:, 0]
    j = torch.arange(size, device=p.device)
    lower = (j[:, None] < j[None, :]) & (j[:, None] >= 1)  # j < k, j ≥ 1
    outer = widths[:, None] * widths[None, :]
    # j < k: w_j w_k (mass beyond k) + w_j (Σ p o in k); j = k: w_j² (mass beyond j) + Σ p o²
    cross = outer[None] * above[:, None, :] + widths[None, :, None] * sums[1][:, None, :]
    second = torch.where(lower[None], cross, torch.zeros_like(cross))
    second = second + second.transpose(1, 2)
    diag = widths**2 * above + sums[2]
    diag[:, 0] = sums[2][:, 0]
    return mean, second + torch.diag_embed(diag)


def fit_slopes(
    s: Tensor, y: Tensor, knots: Tensor, start: Tensor, reg: float, max_iter: int
) -> Tensor:
    """argmin_β mean NLL(softmax(g_β(s)), y) + reg · mean_j (β_{j+1} - β_j)², β > 0, by Newton's
    method from `start`, a backtracking line search keeping each β_j above a tenth of itself."""
    idx, offset = pieces(s, knots)
    widths = _widths(knots)
    true = _label_features(idx.gather(1, y[:, None])[:, 0], offset.gather(1, y[:, None])[:, 0],
                           widths)  # fmt: skip
    size = len(widths)
    d = torch.diff(torch.eye(size, dtype=s.dtype, device=s.device), dim=0)  # [P - 1, P]
    penalty = reg * d.T @ d / max(size - 1, 1)  # Hessian of the penalty (quadratic)

    def value(beta: Tensor) -> float:
        g = evaluate(idx, offset, knots, beta)
        nll = (torch.logsumexp(g, -1) - (true * beta).sum(1)).mean()
        return float(nll + (beta * (penalty * beta).sum(1)).sum() / 2)

    beta = start.clone()
    current = value(beta)
    for _ in range(max_iter):
        p = evaluate(idx, offset, knots, beta).softmax(-1)
        mean, second = _moments(p, idx, offset, widths)
        grad = (mean - true).mean(0) + (penalty * beta).sum(1)
        hess = (second - mean[:, :, None] * mean[:, None, :]).mean(0) + penalty
        # pseudo-inverse: a piece no score falls in (and reg = 0) leaves its slope unidentified
        step = (torch.linalg.pinv(hess, hermitian=True) * grad).sum(1)
        decrement = float((grad * step).sum())
        if not decrement > 1e-12:
            break
        shrink = (0.9 * beta / step).where(step > 0, torch.full_like(beta, np.inf))
        t = min(1.0, float(shrink.min()))
        while t > 1e-10:
            new = value(beta - t * step)
            if new <= current - 1e-4 * t * decrement:
                break
            t /= 2
        else:
            break
        beta, current = beta - t * step, new
    return beta
