"""Regression metrics and the Gaussian head: values against numpy/scipy, calibration on samples
drawn from the predicted Gaussians, training on a toy and on UCI Boston, and input checks."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import logsumexp
from scipy.stats import norm

from peg import data, metrics
from peg.metrics import (
    gaussian_nll,
    interval_coverage,
    log_predictive_density,
    moment_match,
    regression_calibration_error,
    regression_metrics,
    rmse,
    split_gaussian,
)
from peg.models.gaussian import GaussianHead, RegressionMLP, gaussian_nll_loss
from peg.train import Recipe, train

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
UCI_ARCHIVE = SHARED / "uci_gal_hernandez_lobato.tgz"


def ensemble(m: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random member means [M, N], variances [M, N] and targets [N]."""
    rng = np.random.default_rng(seed)
    mean = rng.normal(size=(m, n))
    var = rng.uniform(0.05, 2.0, size=(m, n))
    y = rng.normal(size=n) * 1.5
    return mean, var, y


def lpd_reference(mean: np.ndarray, var: np.ndarray, y: np.ndarray) -> float:
    logp = norm.logpdf(y, loc=mean, scale=np.sqrt(var))  # [M, N]
    return float(np.mean(logsumexp(logp, axis=0) - np.log(mean.shape[0])))


# ---------------------------------------------------------------------------- values
def test_rmse_matches_numpy() -> None:
    mean, _, y = ensemble(3, 50)
    assert rmse(mean, y) == pytest.approx(np.sqrt(np.mean((mean.mean(0) - y) ** 2)), rel=1e-12)
    assert rmse(torch.from_numpy(mean[0]), y) == pytest.approx(
        np.sqrt(np.mean((mean[0] - y) ** 2)), rel=1e-12
    )


@pytest.mark.parametrize("m", [1, 3])
def test_lpd_matches_scipy(m: int) -> None:
    mean, var, y = ensemble(m, 40, seed=m)
    assert log_predictive_density(mean, var, y) == pytest.approx(
        lpd_reference(mean, var, y), rel=1e-10
    )
    # One model as [N] arrays, and a fixed variance (homoscedastic, var = 1 / τ).
    assert log_predictive_density(mean[0], var[0], y) == pytest.approx(
        lpd_reference(mean[:1], var[:1], y), rel=1e-10
    )
    tau = 4.0
    assert log_predictive_density(mean, 1 / tau, y) == pytest.approx(
        lpd_reference(mean, np.full_like(mean, 1 / tau), y), rel=1e-10
    )


def test_single_member_lpd_is_minus_gaussian_nll() -> None:
    mean, var, y = ensemble(1, 30)
    assert log_predictive_density(mean, var, y) == pytest.approx(-gaussian_nll(mean, var, y))
    direct = -np.mean(norm.logpdf(y, mean[0], np.sqrt(var[0])))
    assert gaussian_nll(mean[0], var[0], y) == pytest.approx(direct, rel=1e-12)


def test_gaussian_nll_is_the_moment_matched_gaussian() -> None:
    mean, var, y = ensemble(4, 25)
    mu, total = moment_match(mean, var)
    np.testing.assert_allclose(mu.numpy(), mean.mean(0))
    np.testing.assert_allclose(total.numpy(), var.mean(0) + mean.var(0))  # divisor M
    expected = -np.mean(norm.logpdf(y, mean.mean(0), np.sqrt(var.mean(0) + mean.var(0))))
    assert gaussian_nll(mean, var, y) == pytest.approx(expected, rel=1e-12)
    # Members that disagree: the mixture is bimodal and the two scores differ.
    assert gaussian_nll(mean, var, y) != pytest.approx(-log_predictive_density(mean, var, y))


def test_lpd_stable_for_tiny_variances() -> None:
    mean = np.array([[0.0, 1.0, 2.0], [0.5, 1.5, 2.5]])
    var = np.full_like(mean, 1e-12)
    y = np.array([3.0, -2.0, 10.0])  # far from every member: the densities underflow to 0
    with np.errstate(divide="ignore"):
        naive = np.mean(np.log(norm.pdf(y, mean, np.sqrt(var)).mean(0)))
    assert naive == -np.inf
    lpd = log_predictive_density(mean, var, y)
    assert math.isfinite(lpd)
    assert lpd == pytest.approx(lpd_reference(mean, var, y), rel=1e-10)
    assert math.isfinite(gaussian_nll(mean, var, y))
    # A log-variance of -700 (var ~ 1e-304) from a head still gives finite metrics.
    out = torch.tensor([[[0.0, -700.0], [1.0, -700.0]]], dtype=torch.float64)
    assert math.isfinite(log_predictive_density(*split_gaussian(out), torch.tensor([0.0, 1.0])))


def test_y_scale_reports_original_units() -> None:
    mean, var, y = ensemble(3, 40)
    s = 7.5
    # The same predictions expressed in original units (a scale-only change of units).
    orig = (mean * s, var * s**2, y * s)
    assert rmse(mean, y, y_scale=s) == pytest.approx(rmse(orig[0], orig[2]))
    assert log_predictive_density(mean, var, y, y_scale=s) == pytest.approx(
        log_predictive_density(*orig)
    )
    assert gaussian_nll(mean, var, y, y_scale=torch.tensor(s)) == pytest.approx(gaussian_nll(*orig))
    scaled = regression_metrics(mean, var, y, y_scale=np.float32(s))
    plain = regression_metrics(mean, var, y)
    assert scaled["rmse"] == pytest.approx(plain["rmse"] * s, rel=1e-6)
    assert scaled["lpd"] == pytest.approx(plain["lpd"] - math.log(s), rel=1e-6)
    assert scaled["calibration_error"] == plain["calibration_error"]


def test_split_gaussian_convention() -> None:
    out = torch.tensor([[[1.0, 0.0], [2.0, math.log(4.0)]], [[3.0, -1.0], [4.0, 2.0]]])
    mean, var = split_gaussian(out)
    assert mean.shape == var.shape == (2, 2) and mean.dtype == torch.float64
    torch.testing.assert_close(mean, out[..., 0].double())
    torch.testing.assert_close(var, out[..., 1].double().exp())
    # float32 log-variances beyond exp's float32 range do not overflow.
    assert torch.isfinite(split_gaussian(torch.tensor([[0.0, 100.0]]))[1]).all()
    assert split_gaussian(out[0])[0].shape == (2,)


def test_regression_metrics_keys_and_member_outputs() -> None:
    rng = np.random.default_rng(3)
    outputs = torch.from_numpy(rng.normal(size=(5, 60, 2)))
    y = rng.normal(size=60)
    got = regression_metrics(*split_gaussian(outputs), y)
    assert set(got) == {"rmse", "lpd", "nll", "calibration_error"}
    assert got["lpd"] == pytest.approx(
        lpd_reference(outputs[..., 0].numpy(), np.exp(outputs[..., 1].numpy()), y)
    )
    assert metrics.regression_metrics is regression_metrics


# ---------------------------------------------------------------------------- calibration
def test_coverage_of_samples_from_the_prediction_is_nominal() -> None:
    rng = np.random.default_rng(0)
    n = 20_000
    mean = rng.normal(size=n)
    var = rng.uniform(0.1, 3.0, size=n)
    y = rng.normal(mean, np.sqrt(var))
    levels = (0.1, 0.5, 0.9, 0.95)
    cov = interval_coverage(mean, var, y, levels)
    tol = 4 * np.sqrt(0.25 / n)  # 4 standard errors of a proportion
    np.testing.assert_allclose(cov.numpy(), levels, atol=tol)
    assert regression_calibration_error(mean, var, y) < 0.01
    # Over-confident (variances 4x too small) and under-confident predictions are miscalibrated.
    assert (interval_coverage(mean, var / 4, y, levels).numpy() < np.array(levels) - 0.05).all()
    assert regression_calibration_error(mean, var / 4, y) > 0.1
    assert regression_calibration_error(mean, var * 4, y) > 0.1


def test_mixture_coverage_of_samples_from_the_mixture() -> None:
    rng = np.random.default_rng(1)
    m, n = 3, 20_000
    mean = rng.normal(scale=2.0, size=(m, n))
    var = rng.uniform(0.05, 0.5, size=(m, n))
    pick = rng.integers(0, m, size=n)
    y = rng.normal(mean[pick, np.arange(n)], np.sqrt(var[pick, np.arange(n)]))
    cov = interval_coverage(mean, var, y, (0.5, 0.9), predictive="mixture")
    np.testing.assert_allclose(cov.numpy(), (0.5, 0.9), atol=4 * np.sqrt(0.25 / n))
    assert regression_calibration_error(mean, var, y, predictive="mixture") < 0.01
    assert regression_calibration_error(mean, var, y, levels=[0.2, 0.8]) >= 0.0


# ---------------------------------------------------------------------------- model and loss
def test_gaussian_head_convention_and_floor() -> None:
    torch.manual_seed(0)
    head = GaussianHead(4, min_var=1e-3)
    with torch.no_grad():
        head.linear.bias[1] = -50.0  # raw log-variance far below the floor
    out = head(torch.randn(8, 4))
    assert out.shape == (8, 2)
    assert (out[:, 1].exp() >= 1e-3 * (1 - 1e-6)).all()  # float32 rounding of log(1e-3)
    assert out[:, 1].exp().min().item() == pytest.approx(1e-3, rel=1e-6)
    model = RegressionMLP(3, heteroscedastic=False)
    assert model(torch.randn(5, 3)).shape == (5, 1) and model.out_features == 1
    assert RegressionMLP(3, hidden=(8, 8), dropout=0.1)(torch.randn(5, 3)).shape == (5, 2)


def test_gaussian_nll_loss_matches_torch_and_metric() -> None:
    torch.manual_seed(0)
    out = torch.randn(16, 2, dtype=torch.float64)
    y = torch.randn(16, dtype=torch.float64)
    ref = torch.nn.functional.gaussian_nll_loss(out[:, 0], y, out[:, 1].exp(), full=True)
    torch.testing.assert_close(gaussian_nll_loss(out, y), ref)
    assert gaussian_nll_loss(out, y).item() == pytest.approx(gaussian_nll(*split_gaussian(out), y))
    # Mean-only outputs with a fixed variance 1 / τ.
    fixed = gaussian_nll_loss(out[:, :1], y, var=0.5)
    assert fixed.item() == pytest.approx(gaussian_nll(out[:, 0], 0.5, y))


def sine(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, generator=g) * 6 - 3
    noise = 0.05 + 0.1 * (x[:, 0] + 3)  # heteroscedastic
    return x, torch.sin(x[:, 0]) + noise * torch.randn(n, generator=g)


def test_training_on_a_sine_toy_lowers_the_nll() -> None:
    X, y = sine(256, 0)
    Xt, yt = sine(512, 1)
    torch.manual_seed(0)
    model = RegressionMLP(1, hidden=32)
    with torch.no_grad():
        before = gaussian_nll(*split_gaussian(model(Xt)), yt)
    recipe = Recipe(epochs=40, optimizer="adam", lr=1e-2, batch_size=32, weight_decay=0.0)
    train(model, (X, y), recipe, loss=gaussian_nll_loss, progress=False)  # 320 steps
    with torch.no_grad():
        mean, var = split_gaussian(model(Xt))
    after = gaussian_nll(mean, var, yt)
    assert after < before - 0.5
    # The true noise (std 0.05..0.65) has NLL ≈ 0.20; the best constant variance gets ≈ 0.48:
    # below that, the head has learnt input-dependent variances.
    assert after < 0.45
    assert rmse(mean, yt) < 0.5


@pytest.mark.skipif(not UCI_ARCHIVE.exists(), reason="shared UCI archive absent")
def test_uci_boston_rmse_in_original_units() -> None:
    Xtr, ytr = data.load("uci-boston-housing", "train", root=SHARED, split_index=0)
    Xte, yte = data.load("uci-boston-housing", "test", root=SHARED, split_index=0)
    Xtr, ytr, Xte, yte, stats = data.uci_normalise(Xtr, ytr, Xte, yte)
    torch.manual_seed(0)
    model = RegressionMLP(13)
    recipe = Recipe(epochs=40, optimizer="adam", lr=1e-2, batch_size=32, weight_decay=1e-4)
    train(model, (Xtr, ytr), recipe, loss=gaussian_nll_loss, progress=False)
    with torch.no_grad():
        mean, var = split_gaussian(model(Xte))
    got = regression_metrics(mean, var, yte, y_scale=stats.y_std)
    assert got["rmse"] < 5.0  # the protocol's published numbers are ~3-4
    assert -5.0 < got["lpd"] < -1.5  # Table 13 of the EMP paper: about -2.5 to -3
    # Original-units RMSE is the same as computing in original units directly.
    orig = rmse(stats.y_to_original(mean.float()), stats.y_to_original(yte))
    assert got["rmse"] == pytest.approx(orig, rel=1e-5)


# ---------------------------------------------------------------------------- bad input
def test_bad_inputs_raise_value_errors_naming_the_argument() -> None:
    mean, var, y = ensemble(2, 10)
    with pytest.raises(ValueError, match="y: expected targets of shape"):
        log_predictive_density(mean, var, y[:-1])
    with pytest.raises(ValueError, match="var: expected one number or the shape"):
        log_predictive_density(mean, var[:, :5], y)
    with pytest.raises(ValueError, match="var: expected variances > 0"):
        log_predictive_density(mean, -var, y)
    with pytest.raises(ValueError, match="var: expected variances > 0"):
        gaussian_nll(mean, 0.0, y)
    with pytest.raises(ValueError, match="mean: expected finite"):
        rmse(np.where(np.arange(10) == 3, np.nan, mean), y)
    with pytest.raises(ValueError, match="y: expected finite"):
        regression_metrics(mean, var, np.full(10, np.inf))
    with pytest.raises(ValueError, match="var: expected variances > 0, got NaN"):
        interval_coverage(mean, np.full_like(var, np.nan), y)
    with pytest.raises(ValueError, match="mean: expected member means"):
        rmse(mean[..., None], y)
    with pytest.raises(ValueError, match="y_scale"):
        rmse(mean, y, y_scale=-1.0)
    with pytest.raises(ValueError, match="levels"):
        interval_coverage(mean, var, y, levels=(0.5, 1.0))
    with pytest.raises(ValueError, match="levels"):
        regression_calibration_error(mean, var, y, levels=0)
    with pytest.raises(ValueError, match="predictive"):
        interval_coverage(mean, var, y, predictive="median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="outputs: expected Gaussian head outputs"):
        split_gaussian(torch.zeros(4, 1))
    with pytest.raises(ValueError, match="outputs: expected finite"):
        split_gaussian(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match="y: expected targets"):
        gaussian_nll_loss(torch.zeros(4, 2), torch.zeros(4, 4))
    with pytest.raises(ValueError, match="outputs: expected"):
        gaussian_nll_loss(torch.zeros(4, 3), torch.zeros(4))
    with pytest.raises(ValueError, match="x: expected inputs"):
        RegressionMLP(3)(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="min_var"):
        GaussianHead(3, min_var=0.0)
    with pytest.raises(ValueError, match="heteroscedastic"):
        RegressionMLP(3, heteroscedastic="yes")  # type: ignore[arg-type]


def test_an_infinite_variance_is_zero_density_not_an_error():
    """A log-variance that overflows exp() (a diverged variance head on an outlier)."""
    mean = torch.zeros(2, 3)
    var = torch.tensor([[1.0, 1.0, math.inf], [1.0, math.inf, math.inf]])
    y = torch.zeros(3)
    lpd = log_predictive_density(mean, var, y)
    # points 0, 1: mixtures with at least one finite member; point 2: no density at all
    assert lpd == -math.inf
    assert math.isfinite(log_predictive_density(mean[:, :2], var[:, :2], y[:2]))
    assert gaussian_nll(mean, var, y) == math.inf
    assert rmse(mean, y) == 0.0
    with pytest.raises(ValueError, match="var: expected variances > 0, got NaN"):
        log_predictive_density(mean, torch.full((2, 3), math.nan), y)
