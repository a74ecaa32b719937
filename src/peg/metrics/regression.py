"""Regression metrics for (ensembles of) Gaussian predictions, computed in float64.

Inputs: member means `mean [M, N]` (or one model's `[N]`), variances `var` of the same shape
or one number (a homoscedastic model with fixed precision τ: `var = 1 / τ`), targets `y [N]`.
Tensors or numpy arrays. Every member m predicts N(μ_m, σ²_m); the ensemble predictive is the
equal-weight mixture (1/M) Σ_m N(μ_m, σ²_m).

Gaussian head outputs (the convention of `peg.models.gaussian`): a model predicting a
Gaussian returns `[..., 2]` with `[..., 0]` the mean and `[..., 1]` the **log-variance**
(variance floor already applied by the head); `split_gaussian(outputs)` turns member outputs
`[M, N, 2]` into `(mean [M, N], var [M, N])`. Mean-only models (`[..., 1]`) use
`outputs[..., 0]` and a fixed `var`.

`y_scale` reports metrics in the data's original units when `mean`, `var` and `y` are
standardised targets (the UCI protocol): pass the training-set std of y. RMSE is multiplied
by it and log-densities shift by log(y_scale) (a density in original units is the
standardised one divided by y_scale); coverage and calibration error do not change.

- `rmse(mean, y)`: root mean squared error of the ensemble mean.
- `log_predictive_density(mean, var, y)`: mean log density of the mixture (the UCI "test
  log-likelihood"; higher is better).
- `gaussian_nll(mean, var, y)`: NLL of the moment-matched Gaussian (lower is better), a float
  (the formula is `peg.losses.gaussian_nll_elementwise`, as for the training losses).
- `interval_coverage(mean, var, y, levels)`, `regression_calibration_error(...)`: calibration
  of central predictive intervals.
- `regression_metrics(mean, var, y)`: "rmse", "lpd", "nll", "calibration_error".
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from peg.losses import gaussian_nll_elementwise
from peg.source._values import as_tensor
from peg.utils.scalars import check_positive_int

Predictive = Literal["moment", "mixture"]
DEFAULT_LEVELS = (0.5, 0.9, 0.95)


def _real(a: Any, name: str) -> Tensor:
    t = as_tensor(a, name)
    if t.is_complex() or t.dtype == torch.bool:
        raise ValueError(f"{name}: expected real numbers, got dtype {t.dtype}")
    return t.double()


def _finite(t: Tensor, name: str) -> None:
    if not torch.isfinite(t).all():
        raise ValueError(f"{name}: expected finite values, got NaN or inf")


def _check_mean(mean: Any) -> Tensor:
    t = _real(mean, "mean")
    if t.ndim not in (1, 2):
        raise ValueError(
            f"mean: expected member means [M, N] or one model's means [N], got shape "
            f"{tuple(t.shape)} (for Gaussian head outputs [..., 2] use split_gaussian first)"
        )
    if t.numel() == 0:
        raise ValueError(f"mean: expected M >= 1 and N >= 1, got shape {tuple(t.shape)} (empty)")
    _finite(t, "mean")
    return t


def _check_var(var: Any, mean: Tensor) -> Tensor:
    t = _real(var, "var").to(mean.device)
    if t.ndim != 0 and t.shape != mean.shape:
        raise ValueError(
            f"var: expected one number or the shape of mean {tuple(mean.shape)}, got shape "
            f"{tuple(t.shape)}"
        )
    # +inf is allowed: a head whose log-variance overflowed exp() predicts zero density there
    # (its member's log density is -inf; a mixture of finite members is unaffected)
    if torch.isnan(t).any():
        raise ValueError("var: expected variances > 0, got NaN")
    if (t <= 0).any():
        raise ValueError(f"var: expected variances > 0, got min {t.min().item():.3g}")
    return t.expand_as(mean)


def _check_y(y: Any, mean: Tensor) -> Tensor:
    t = _real(y, "y").to(mean.device)
    n = mean.shape[-1]
    if t.shape != (n,):
        raise ValueError(f"y: expected targets of shape [{n}] (N of mean), got {tuple(t.shape)}")
    _finite(t, "y")
    return t


def _check_scale(y_scale: Any) -> float:
    if y_scale is None:
        return 1.0
    if isinstance(y_scale, Tensor | np.ndarray) and y_scale.ndim == 0:  # e.g. stats.y_std
        y_scale = y_scale.item()
    ok = isinstance(y_scale, numbers.Real) and not isinstance(y_scale, bool | np.bool_)
    if not ok or not math.isfinite(y_scale) or y_scale <= 0:
        raise ValueError(f"y_scale: expected a finite number > 0 (the std of y), got {y_scale!r}")
    return float(y_scale)


def _members(mean: Any, var: Any, y: Any) -> tuple[Tensor, Tensor, Tensor]:
    """Validated `(mean [M, N], var [M, N], y [N])` float64 (one model becomes M = 1)."""
    m = _check_mean(mean)
    v = _check_var(var, m)
    t = _check_y(y, m)
    return m.reshape(-1, m.shape[-1]), v.reshape(-1, m.shape[-1]), t


def split_gaussian(outputs: Any) -> tuple[Tensor, Tensor]:
    """Gaussian head outputs `[..., 2]` (mean, log-variance) → `(mean [...], var [...])` float64.

    Member outputs `[M, N, 2]` give `[M, N]` each; one model's `[N, 2]` gives `[N]` each.
    The variance is `exp(outputs[..., 1])`, computed in float64 so large log-variances of
    float32 outputs do not overflow.
    """
    t = _real(outputs, "outputs")
    if t.ndim < 2 or t.shape[-1] != 2:
        raise ValueError(
            f"outputs: expected Gaussian head outputs [..., 2] (mean, log-variance), got shape "
            f"{tuple(t.shape)}; for mean-only outputs [..., 1] use outputs[..., 0] and a fixed var"
        )
    _finite(t, "outputs")
    return t[..., 0], t[..., 1].exp()


def moment_match(mean: Any, var: Any) -> tuple[Tensor, Tensor]:
    """Mean and total variance of the mixture, `(mean [N], var [N])` float64.

    The total variance is the mean member variance (aleatoric) plus the variance of the member
    means over members (epistemic, population form, divisor M).
    """
    m = _check_mean(mean)
    v = _check_var(var, m)
    m, v = m.reshape(-1, m.shape[-1]), v.reshape(-1, m.shape[-1])
    mu = m.mean(0)
    return mu, v.mean(0) + (m - mu).pow(2).mean(0)


def rmse(mean: Any, y: Any, y_scale: Any = None) -> float:
    """Root mean squared error of the ensemble mean (mean over members) against `y`.

    Args:
        mean: member means `[M, N]` or means `[N]`.
        y: targets `[N]`.
        y_scale: std of y to report in original units (RMSE × y_scale); None for as is.
    """
    m = _check_mean(mean)
    t = _check_y(y, m)
    scale = _check_scale(y_scale)
    mu = m.reshape(-1, m.shape[-1]).mean(0)
    return float((mu - t).pow(2).mean().sqrt()) * scale


def _log_normal(y: Tensor, mean: Tensor, var: Tensor) -> Tensor:
    # In log space throughout: finite for tiny variances where the density itself underflows.
    return -gaussian_nll_elementwise(mean, var.log(), y, var=var)


def log_predictive_density(mean: Any, var: Any, y: Any, y_scale: Any = None) -> float:
    """Mean log density of `y` under the mixture of member Gaussians (UCI "test LL").

    (1/N) Σ_n log((1/M) Σ_m N(y_n | μ_mn, σ²_mn)), as logsumexp over members minus log M.

    Args:
        mean: member means `[M, N]` or means `[N]`.
        var: variances of the same shape, or one number (fixed precision: 1 / τ).
        y: targets `[N]`.
        y_scale: std of y; the result is then in original units (minus log y_scale).

    Higher is better. For M = 1 it equals `-gaussian_nll`.
    """
    scale = _check_scale(y_scale)
    return float(point_log_density(mean, var, y).mean()) - math.log(scale)


def point_log_density(mean: Any, var: Any, y: Any) -> Tensor:
    """Log density of each `y` under the mixture of member Gaussians `[N]` (arguments as
    `log_predictive_density`; standardised units)."""
    m, v, t = _members(mean, var, y)
    return torch.logsumexp(_log_normal(t, m, v), dim=0) - math.log(m.shape[0])


def gaussian_nll(mean: Any, var: Any, y: Any, y_scale: Any = None) -> float:
    """Mean NLL of `y` under the moment-matched Gaussian N(μ̄, σ̄²) of the ensemble.

    Unlike `log_predictive_density`, which scores the mixture itself, this scores a single
    Gaussian with the mixture's mean and total variance (see `moment_match`), as Deep
    Ensembles (Lakshminarayanan et al. 2017) do. The two agree for M = 1 (NLL = -LPD); for
    M > 1 the mixture can be multi-modal or heavy-tailed and the numbers differ.

    Args:
        mean: member means `[M, N]` or means `[N]`.
        var: variances of the same shape, or one number.
        y: targets `[N]`.
        y_scale: std of y; the result is then in original units (plus log y_scale).

    Lower is better.
    """
    _, _, t = _members(mean, var, y)
    scale = _check_scale(y_scale)
    mu, total = moment_match(mean, var)
    nll = gaussian_nll_elementwise(mu, total.log(), t, var=total)
    return float(nll.mean()) + math.log(scale)


def _check_levels(levels: Any) -> Tensor:
    try:
        t = torch.as_tensor(levels, dtype=torch.float64).reshape(-1)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"levels: expected a sequence of numbers in (0, 1), got {levels!r}") from e
    if t.numel() == 0 or not torch.isfinite(t).all() or (t <= 0).any() or (t >= 1).any():
        raise ValueError(f"levels: expected numbers in (0, 1), got {levels!r}")
    return t


def _pit(mean: Any, var: Any, y: Any, predictive: Predictive) -> Tensor:
    """Predictive CDF at the targets, F(y_n), `[N]` (probability integral transform)."""
    m, v, t = _members(mean, var, y)
    if predictive == "moment":
        mu, total = moment_match(m, v)
        return torch.special.ndtr((t - mu) / total.sqrt())
    if predictive == "mixture":
        return torch.special.ndtr((t - m) / v.sqrt()).mean(0)
    raise ValueError(f"predictive: expected 'moment' or 'mixture', got {predictive!r}")


def interval_coverage(
    mean: Any,
    var: Any,
    y: Any,
    levels: Sequence[float] | Tensor = DEFAULT_LEVELS,
    predictive: Predictive = "moment",
) -> Tensor:
    """Fraction of targets inside the central predictive interval at each level, `[L]` float64.

    The central interval at level p spans the (1 - p)/2 and (1 + p)/2 quantiles, so `y_n` is
    inside iff |2 F(y_n) - 1| <= p with F the predictive CDF. A calibrated model has
    coverage ≈ p; below p means over-confident (intervals too narrow).

    Args:
        mean: member means `[M, N]` or means `[N]`.
        var: variances of the same shape, or one number.
        y: targets `[N]`.
        levels: nominal levels in (0, 1).
        predictive: "moment" (default): the moment-matched Gaussian N(μ̄, σ̄²); "mixture": the
            mixture of member Gaussians itself (equal-tailed intervals of its CDF).
    """
    p = _check_levels(levels)
    u = _pit(mean, var, y, predictive)
    dev = (2 * u - 1).abs()
    return (dev[None, :] <= p.to(dev.device)[:, None]).double().mean(1)


def regression_calibration_error(
    mean: Any,
    var: Any,
    y: Any,
    levels: int | Sequence[float] | Tensor = 19,
    predictive: Predictive = "moment",
) -> float:
    """Mean |coverage - level| over a grid of levels, in [0, 1]; 0 is perfectly calibrated.

    Args:
        mean, var, y, predictive: as in `interval_coverage`.
        levels: the levels, or how many evenly spaced ones: L gives i / (L + 1), i = 1..L
            (default 19: 0.05, 0.10, ..., 0.95).
    """
    if isinstance(levels, int) and not isinstance(levels, bool):
        n = check_positive_int(levels, "levels")
        grid = torch.arange(1, n + 1, dtype=torch.float64) / (n + 1)
    else:
        grid = _check_levels(levels)
    cov = interval_coverage(mean, var, y, grid, predictive)
    return float((cov - grid.to(cov.device)).abs().mean())


def regression_metrics(
    mean: Any,
    var: Any,
    y: Any,
    y_scale: Any = None,
    levels: int | Sequence[float] | Tensor = 19,
) -> dict[str, float]:
    """All regression metrics: "rmse", "lpd", "nll", "calibration_error".

    Args:
        mean: member means `[M, N]` or means `[N]` (Gaussian head outputs: `split_gaussian`).
        var: variances of the same shape, or one number (fixed precision: 1 / τ).
        y: targets `[N]`.
        y_scale: std of y, to report RMSE, LPD and NLL in original units (UCI protocol).
        levels: the calibration grid (see `regression_calibration_error`).
    """
    m, v, t = _members(mean, var, y)  # validate and convert once
    return {
        "rmse": rmse(m, t, y_scale),
        "lpd": log_predictive_density(m, v, t, y_scale),
        "nll": gaussian_nll(m, v, t, y_scale),
        "calibration_error": regression_calibration_error(m, v, t, levels),
    }
