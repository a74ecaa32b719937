"""Weighted split conformal prediction under shift (`shift="covariate" | "label"`) against an
independent NumPy implementation of Tibshirani et al. 2019 / Podkopaev & Ramdas 2021, its
coverage on a constructed shift where split conformal loses it, and its bad inputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import peg
from bad_inputs import raises_test
from peg.methods.conformal._shift import label_thresholds, sorted_weighted, weighted_thresholds
from peg.methods.conformal._split import conformal_quantile
from peg.train import Recipe, train

ALPHA = 0.1


def _sample(n: int, tilt: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """3 classes by the angle of x ~ N(0, I₂), labels noisier as x₀ grows (flipped at random
    with probability 0.7·sigmoid(2(x₀ − 1))); `tilt` > 0: the inputs reweighted by
    exp(tilt·x₀) (rejection sampling), a covariate shift towards the noisy region."""
    rng = np.random.default_rng(seed)
    xs, ys = [], []
    while sum(len(x) for x in xs) < n:
        x = rng.standard_normal((4 * n, 2))
        keep = rng.random(4 * n) < np.exp(tilt * (x[:, 0] - 4))
        x = x[keep]
        clean = ((np.arctan2(x[:, 1], x[:, 0]) + np.pi) / (2 * np.pi / 3)).astype(int) % 3
        flip = rng.random(len(x)) < 0.7 / (1 + np.exp(-2 * (x[:, 0] - 1)))
        xs.append(x)
        ys.append(np.where(flip, rng.integers(0, 3, len(x)), clean))
    x, y = np.concatenate(xs)[:n], np.concatenate(ys)[:n]
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y)


def _model() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 3))
    trained, _ = train(net, _sample(3000, 0.0, 1), Recipe(epochs=15, lr=0.05, batch_size=64))
    return trained.eval()


MODEL = _model()
CALIB, TARGET, TEST = _sample(2000, 0.0, 2), _sample(1500, 1.5, 3)[0], _sample(6000, 1.5, 4)


def _coverage(sets: torch.Tensor, y: torch.Tensor) -> float:
    return float(sets[torch.arange(len(y)), y].float().mean())


def _numpy_weighted_threshold(s: np.ndarray, w: np.ndarray, w_test: float, alpha: float) -> float:
    """Tibshirani et al. 2019, eq. (7): the level-(1 − α) quantile of Σ pᵢ δ_{sᵢ} + p_{n+1} δ_∞."""
    p = np.r_[w, w_test] / (w.sum() + w_test)
    values = np.r_[s, np.inf]
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(p[order])
    return float(values[order][np.argmax(cum >= 1 - alpha - 1e-12)])


def test_equal_weights_give_the_split_conformal_quantile():
    for n in (9, 10, 99, 500):
        s = torch.rand(n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
        for alpha in (0.1, 0.2, 0.45):
            sorted_s, cum = sorted_weighted(s, torch.ones(n))
            q = weighted_thresholds(sorted_s, cum, torch.ones(1), alpha)
            assert float(q[0]) == conformal_quantile(s, alpha), (n, alpha)


def test_thresholds_match_numpy():
    rng = np.random.default_rng(0)
    s, w = rng.random(300), rng.gamma(0.5, size=300)
    w_test = np.r_[rng.gamma(0.5, size=50), 500.0]  # the last one: +∞ (its own mass > α)
    got = weighted_thresholds(
        *sorted_weighted(torch.tensor(s), torch.tensor(w)), torch.tensor(w_test), ALPHA
    ).numpy()
    expected = [_numpy_weighted_threshold(s, w, v, ALPHA) for v in w_test]
    np.testing.assert_array_equal(got, expected)
    assert got[-1] == np.inf
    y = rng.integers(0, 4, 300)
    wc = np.array([0.5, 1.0, 2.0, 3.0])
    per_class = label_thresholds(torch.tensor(s), torch.tensor(y), torch.tensor(wc), ALPHA)
    expected = [_numpy_weighted_threshold(s, wc[y], wc[c], ALPHA) for c in range(4)]
    np.testing.assert_array_equal(per_class.numpy(), expected)


def test_covariate_sets_match_numpy_and_recover_the_coverage():
    split = peg.ConformalClassifier(alpha=ALPHA).fit(MODEL, CALIB)
    cp = peg.ConformalClassifier(alpha=ALPHA, shift="covariate", features="inputs")
    cp.fit(MODEL, CALIB, target=TARGET)
    assert cp.features_ == "inputs" and 0.6 < cp.domain_auroc_ < 0.99
    sets = cp.predict_set(TEST[0])
    # the sets, recomputed in NumPy from the scores and the fitted domain classifier's weights
    with torch.no_grad():
        p_cal = MODEL(CALIB[0]).softmax(-1).double().numpy()
        p_test = MODEL(TEST[0][:200]).softmax(-1).double().numpy()
    s_cal = 1 - p_cal[np.arange(len(CALIB[1])), CALIB[1].numpy()]
    w_cal = cp.domain_.calib_
    w_test = cp.domain_(TEST[0][:200].double().numpy())
    q = np.array([_numpy_weighted_threshold(s_cal, w_cal, v, ALPHA) for v in w_test])
    np.testing.assert_array_equal(sets[:200].numpy(), (1 - p_test) <= q[:, None])
    # split conformal loses its coverage on the shifted test set; the weighted sets recover it
    lost = _coverage(split.predict_set(TEST[0]), TEST[1])
    kept = _coverage(sets, TEST[1])
    assert lost < 1 - ALPHA - 0.1 and abs(kept - (1 - ALPHA)) < 0.03, (lost, kept)


def test_penultimate_features_by_default_and_the_fallback():
    cp = peg.ConformalClassifier(alpha=ALPHA, shift="covariate").fit(MODEL, CALIB, target=TARGET)
    assert cp.features_ == "penultimate"
    assert abs(_coverage(cp.predict_set(TEST[0]), TEST[1]) - (1 - ALPHA)) < 0.03
    linear = nn.Linear(2, 3)  # no trunk: nothing before the last layer
    with pytest.warns(UserWarning, match="penultimate features unavailable"):
        cp = peg.ConformalClassifier(shift="covariate").fit(linear, CALIB, target=TARGET)
    assert cp.features_ == "logits"


def test_label_shift_sets_match_the_weighted_quantile_and_cover():
    rng = np.random.default_rng(5)
    test_x, test_y = _sample(20000, 0.0, 6)
    keep = rng.random(len(test_y)) < np.array([1.0, 0.3, 0.1])[test_y.numpy()]
    target_x, target_y = test_x[keep], test_y[keep]
    half = len(target_y) // 2
    cp = peg.ConformalClassifier(alpha=ALPHA, shift="label")
    cp.fit(MODEL, CALIB, target=target_x[:half])
    with torch.no_grad():
        p_cal = MODEL(CALIB[0]).softmax(-1).double().numpy()
    s_cal = 1 - p_cal[np.arange(len(CALIB[1])), CALIB[1].numpy()]
    w = cp.weights_.numpy()
    expected = [
        _numpy_weighted_threshold(s_cal, w[CALIB[1].numpy()], w[c], ALPHA) for c in range(3)
    ]
    np.testing.assert_allclose(cp.quantile_.numpy(), expected)
    covered = _coverage(cp.predict_set(target_x[half:]), target_y[half:])
    assert abs(covered - (1 - ALPHA)) < 0.03


def test_covariate_regression_intervals():
    x, _ = CALIB
    yr = (
        x[:, 0] * 2
        + torch.randn(len(x), generator=torch.Generator().manual_seed(0))
        * (0.2 + (x[:, 0] > 1).float())
    ).double()
    head = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 2))
    with torch.no_grad():  # a mean of 2·x₀ and a fixed log-variance: the model is given
        head[2].weight.zero_()
        head[2].bias.zero_()
        head[0].weight.zero_()
        head[0].weight[0, 0] = 0.1
        head[2].weight[0, 0] = 20.0
    reg = peg.ConformalRegressor(
        alpha=ALPHA, score="absolute", shift="covariate", features="inputs"
    ).fit(head, (x, yr.float()), target=TARGET)
    intervals = reg.predict_interval(TEST[0][:100])
    assert intervals.shape == (100, 2) and (intervals[:, 1] >= intervals[:, 0]).all()
    plain = peg.ConformalRegressor(alpha=ALPHA, score="absolute").fit(head, (x, yr.float()))
    wider = (intervals[:, 1] - intervals[:, 0]).mean() > (
        plain.predict_interval(TEST[0][:100]).diff(dim=1).mean()
    )
    assert wider  # the target sits where the noise is larger
    # the half-widths, recomputed in NumPy from the residuals and the fitted weights
    with torch.no_grad():
        mu_cal = head(x)[:, 0].double().numpy()
    s_cal = np.abs(yr.float().double().numpy() - mu_cal)
    w_test = reg.domain_(TEST[0][:100].double().numpy())
    q = [_numpy_weighted_threshold(s_cal, reg.domain_.calib_, v, ALPHA) for v in w_test]
    half = (intervals[:, 1] - intervals[:, 0]).numpy() / 2
    np.testing.assert_allclose(half, q, rtol=1e-6)


def _covariate(target: object, **kwargs: object) -> object:
    cp = peg.ConformalClassifier(**({"shift": "covariate", "features": "inputs"} | kwargs))
    return cp.fit(MODEL, CALIB, target=target)


ERROR_CASES = [
    (
        "conformal under shift",
        "unknown shift",
        lambda: peg.ConformalClassifier(shift="concept"),
        ValueError,
        "shift: expected one of",
    ),
    (
        "conformal under shift",
        "unknown features",
        lambda: peg.ConformalClassifier(shift="covariate", features="pixels"),
        ValueError,
        "features: expected one of",
    ),
    (
        "conformal under shift",
        "label shift for regression",
        lambda: peg.ConformalRegressor(shift="label"),
        ValueError,
        "shift: 'label' is for classes",
    ),
    (
        "conformal under shift",
        "n_folds < 2",
        lambda: peg.ConformalClassifier(shift="covariate", n_folds=1),
        ValueError,
        "n_folds",
    ),
    (
        "conformal under shift",
        "target too small",
        lambda: _covariate(TARGET[:20]),
        ValueError,
        "target: 20 points are too few",
    ),
    (
        "conformal under shift",
        "target with other features",
        lambda: _covariate(torch.zeros(100, 3)),
        ValueError,
        r"target: expected inputs of shape \[N, 2\]",
    ),
    (
        "conformal under shift",
        "target without shift",
        lambda: _covariate(TARGET, shift=None),
        ValueError,
        "target: only used with shift=",
    ),
    (
        "conformal under shift",
        "shift without target",
        lambda: _covariate(None),
        ValueError,
        "target: shift='covariate' needs unlabelled inputs",
    ),
    (
        "conformal under shift",
        "domains that do not overlap (unbounded weights)",
        lambda: _covariate(TARGET + 50.0),
        ValueError,
        "target: the domain classifier separates",
    ),
]
test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)


def test_sets_fn_and_save_are_refused_under_covariate_shift(tmp_path):
    cp = peg.ConformalClassifier(shift="covariate", features="inputs")
    cp.fit(MODEL, CALIB, target=TARGET)
    with pytest.raises(TypeError, match="use predict_set"):
        cp.sets_fn()
    with pytest.raises(TypeError, match="save: a covariate-shift conformal predictor"):
        cp.save(str(tmp_path / "cp"))


def test_a_model_on_the_gpu_with_data_on_the_cpu(gpu):
    import copy

    on_gpu = copy.deepcopy(MODEL).to(gpu)
    for shift in ("covariate", "label"):
        a = peg.ConformalClassifier(shift=shift).fit(on_gpu, CALIB, target=TARGET)
        b = peg.ConformalClassifier(shift=shift).fit(MODEL, CALIB, target=TARGET)
        sets_a, sets_b = a.predict_set(TEST[0][:300]), b.predict_set(TEST[0][:300])
        assert sets_a.device == gpu
        different = (sets_a.to("cpu") != sets_b).float().mean()
        assert different < 0.01  # float rounding near a threshold


def test_the_label_shift_version_saves_and_loads(tmp_path):
    cp = peg.ConformalClassifier(shift="label", score="aps").fit(MODEL, CALIB, target=TARGET)
    loaded = peg.load(cp.save(str(tmp_path / "cp")), _model_like())
    assert isinstance(loaded, peg.ConformalClassifier) and loaded.shift == "label"
    torch.testing.assert_close(loaded.quantile_, cp.quantile_)
    assert torch.equal(loaded.predict_set(TEST[0][:200]), cp.predict_set(TEST[0][:200]))
    evaluated = peg.evaluate(loaded, *TEST, metrics=["coverage", "set_size"])
    assert 0 < evaluated["coverage"] <= 1


def _model_like() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 32), nn.Tanh(), nn.Linear(32, 3))
