"""Label-shift estimators as pure functions of tensors (what `peg.LabelShift` fits).

Under label shift the class priors move (q(y) ≠ p(y)) and the class-conditional inputs stay
(q(x | y) = p(x | y)), so q(y | x) ∝ p(y | x) · q(y) / p(y): the source predictor is adapted by
reweighting its probabilities with w = q / p and renormalising.

- `fit_bcts(scores, y)`: bias-corrected temperature scaling (Alexandari et al. 2020), the
  calibration step before EM: softmax(s / T + b), T > 0 and a bias per class, fitted on
  validation NLL (`bias=False`: plain temperature scaling);
- `em_priors(probs, source)`: maximum likelihood of q by EM (Saerens et al. 2002) on the
  calibrated source probabilities of the unlabelled target points `[N, C]`;
- `bbse_priors(confusion, counts, ...)`: black-box shift estimation (Lipton et al. 2018), w
  solving Ĉ w = μ̂ with Ĉ[i, j] = P_val(ŷ = i, y = j) and μ̂[i] = P_target(ŷ = i), clipped at 0,
  with a delta-method standard error;
- `PriorShift`: the fitted `LabelShift` as a module (its `to_module`), registered in
  `_calibrator.EXPORTS` under `LabelShift`'s method name.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from peg.methods.calibration._affine import finite_scores
from peg.methods.calibration._calibrator import EXPORTS
from peg.methods.calibration._export import CalibrationMap, as_f64


def fit_bcts(
    scores: Tensor, y: Tensor, bias: bool = True, max_iter: int = 200
) -> tuple[float, Tensor]:
    """(T, b `[C]`) minimising NLL(softmax(scores / T + b), y) for scores `[N, C]` (log p̄),
    labels `[N]`; float64, L-BFGS from T = 1, b = 0 (b stays 0 when `bias=False`)."""
    s = finite_scores(scores.detach())
    y = y.to(s.device).long()
    log_t = torch.zeros((), dtype=torch.float64, device=s.device, requires_grad=True)
    b = torch.zeros(s.shape[1], dtype=torch.float64, device=s.device, requires_grad=bias)
    params = [log_t, b] if bias else [log_t]
    opt = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(s / log_t.exp() + b, y)
        loss.backward()
        return loss

    opt.step(closure)
    t = float(log_t.detach().exp())
    if not math.isfinite(t) or t <= 0 or not torch.isfinite(b).all():
        raise FloatingPointError(f"bias-corrected temperature scaling diverged (T = {t})")
    return t, (b.detach() - b.detach().mean()).cpu()  # b is defined up to a constant


def calibrated_log_probs(scores: Tensor, temperature: float, bias: Tensor | None) -> Tensor:
    """log softmax(scores / T + b) `[N, C]` float64 (b None: no bias)."""
    s = finite_scores(scores) / temperature
    if bias is not None:
        s = s + bias.to(s)
    return s.log_softmax(-1)


def em_priors(
    probs: Tensor, source: Tensor, max_iter: int = 1000, tol: float = 1e-8
) -> tuple[Tensor, int, bool]:
    """Target priors by EM (Saerens et al. 2002): from q⁰ = p (the source priors `[C]`), the
    posteriors p(y | x_i) q / p renormalised (E), then q = their mean over the points (M),
    until the largest change of q is below `tol`. Returns (q `[C]` float64, iterations, whether
    it converged); `probs` `[N, C]` are the calibrated source probabilities of the target."""
    p = probs.double()
    src = source.to(p).double()
    q = src.clone()
    for it in range(1, max_iter + 1):
        post = p * (q / src)
        post = post / post.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
        new = post.mean(0)
        change = float((new - q).abs().max())
        q = new
        if change < tol:
            return q.cpu(), it, True
    return q.cpu(), max_iter, False


def confusion(pred: Tensor, y: Tensor, classes: int) -> Tensor:
    """Joint frequencies `[C, C]` float64: entry [i, j] = P(ŷ = i, y = j) over the points."""
    index = pred.long() * classes + y.to(pred.device).long()
    counts = torch.bincount(index, minlength=classes * classes).double()
    return (counts / len(pred)).reshape(classes, classes).cpu()


def bbse_priors(
    joint: Tensor, counts: Tensor, source: Tensor, n_val: int
) -> tuple[Tensor, Tensor, float]:
    """Target priors by BBSE (Lipton et al. 2018) and their standard errors, both `[C]`, and
    the condition number of Ĉ.

    `joint` `[C, C]`: P_val(ŷ = i, y = j); `counts` `[C]`: how many target points are predicted
    as each class; `source` `[C]`: the validation class frequencies. w = Ĉ⁻¹ μ̂ (least squares
    when Ĉ is singular), clipped at 0; q = w ⊙ p renormalised. The standard error is the
    delta method's on w: Cov(ŵ) ≈ Ĉ⁻¹ (Σ_μ + Σ_C) Ĉ⁻ᵀ, with Σ_μ = (diag μ − μμᵀ) / n_target
    (the multinomial noise of μ̂) and Σ_C = (diag(Ĉ w²) − μμᵀ) / n_val (that of Ĉ w), then
    scaled by p (the renormalisation is ignored: an asymptotic, first-order interval).
    """
    c = joint.double()
    n_target = float(counts.sum())
    mu = counts.double().cpu() / n_target
    cond = float(torch.linalg.cond(c))
    if not math.isfinite(cond) or cond > 1e8:
        warnings.warn(
            f"val: the confusion matrix is singular or nearly so (condition number {cond:.3g}: "
            "some class is never predicted, or two are confused alike); BBSE's weights are a "
            "least-squares solution and unreliable",
            stacklevel=4,  # bbse_priors <- _estimate <- fit <- the caller
        )
        w = torch.linalg.lstsq(c, mu[:, None], driver="gelsd").solution[:, 0]
        inverse = torch.linalg.pinv(c)
    else:
        w = torch.linalg.solve(c, mu)
        inverse = torch.linalg.inv(c)
    sigma_mu = (torch.diag(mu) - torch.outer(mu, mu)) / n_target
    sigma_c = (torch.diag(c @ w.square()) - torch.outer(mu, mu)) / n_val
    cov = inverse @ (sigma_mu + sigma_c) @ inverse.T
    se = cov.diagonal().clamp_min(0).sqrt() * source.double().cpu()
    q = w.clamp_min(0) * source.double().cpu()
    if float(q.sum()) <= 0:
        raise ValueError(
            "target: BBSE found no class with a positive weight (Ĉ w = μ̂ has no "
            "non-negative solution); the shift is not a label shift"
        )
    return q / q.sum(), se, cond


class PriorShift(CalibrationMap):
    """`LabelShift`: softmax(s / T + b) reweighted by the target-to-source prior ratios."""

    temperature: Tensor
    bias: Tensor
    log_weights: Tensor

    def __init__(self, scores: str, temperature: float, bias: Tensor, weights: Tensor) -> None:
        super().__init__(scores)
        self.register_buffer("temperature", as_f64(temperature))
        self.register_buffer("bias", as_f64(bias))
        tiny = torch.finfo(torch.float64).tiny
        self.register_buffer("log_weights", as_f64(weights).clamp_min(tiny).log())

    def log_probs(self, s: Tensor) -> Tensor:
        temperature: Any = self.temperature  # a 0-d buffer where a float is documented
        cal = calibrated_log_probs(s, temperature, self.bias)
        return cal + self.log_weights


EXPORTS.update(
    {"label_shift": lambda c: PriorShift(c.scores_, c.temperature_, c.bias_, c.weights_)}
)
