"""`peg.OODDetector` (Mahalanobis, Lee et al. 2018; k-NN, Sun et al. 2022) against direct
NumPy / scikit-learn computations, on its own and as `peg.compare(..., ood_score=...)`."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from sklearn.neighbors import NearestNeighbors
from torch import nn

import peg
from bad_inputs import raises_test
from peg.metrics.ood import auroc

from conftest import moons, overfit


def _blobs(n: int, seed: int, shift: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Three Gaussian classes in 3-D, moved by `shift` along every axis."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = np.array([[0, 0, 0], [3, 0, 1], [0, 3, -1]])[y] + rng.standard_normal((n, 3)) + shift
    return torch.tensor(x, dtype=torch.float32), torch.tensor(y)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 3)).eval()


VAL, TEST = _blobs(400, 0), _blobs(200, 1)
FAR = _blobs(200, 2, shift=-6.0)[0]  # away from every class (k-NN reads directions only)


def test_mahalanobis_matches_numpy():
    det = peg.OODDetector(score="mahalanobis", features="inputs", ridge=0.0).fit(_model(), VAL)
    x, y = VAL[0].double().numpy(), VAL[1].numpy()
    means = np.stack([x[y == c].mean(0) for c in range(3)])
    centred = x - means[y]
    precision = np.linalg.inv(centred.T @ centred / len(x))
    t = TEST[0].double().numpy()
    d = np.stack([np.einsum("nd,de,ne->n", t - m, precision, t - m) for m in means], 1)
    np.testing.assert_allclose(det.ood_score(TEST[0]).numpy(), d.min(1), rtol=1e-8)
    assert det.means_.shape == (3, 3) and det.features_ == "inputs"


def test_knn_matches_sklearn():
    det = peg.OODDetector(score="knn", k=7, features="inputs").fit(_model(), VAL[0])
    bank = VAL[0].double().numpy()
    bank /= np.linalg.norm(bank, axis=1, keepdims=True)
    t = TEST[0].double().numpy()
    t /= np.linalg.norm(t, axis=1, keepdims=True)
    dist, _ = NearestNeighbors(n_neighbors=7).fit(bank).kneighbors(t)
    np.testing.assert_allclose(det.ood_score(TEST[0]).numpy(), dist[:, -1], rtol=1e-8)


@pytest.mark.parametrize("score", ["mahalanobis", "knn"])
def test_penultimate_features_flag_far_points(score):
    det = peg.OODDetector(score=score, k=10).fit(_model(), VAL)
    assert det.features_ == "penultimate"
    assert auroc(det.ood_score(TEST[0]), det.ood_score(FAR)) > 0.9


ERROR_CASES = [
    (
        "OODDetector",
        "unknown score",
        lambda: peg.OODDetector(score="odin"),
        ValueError,
        "score: expected one of",
    ),
    ("OODDetector", "k < 1", lambda: peg.OODDetector(k=0), ValueError, "k: "),
    (
        "OODDetector",
        "scores before fit",
        lambda: peg.OODDetector().ood_score(TEST[0]),
        peg.NotFittedError,
        "fit",
    ),
    (
        "OODDetector",
        "k above the validation points",
        lambda: peg.OODDetector(score="knn", k=500).fit(_model(), VAL),
        ValueError,
        "k: 500 neighbours, but val has only 400",
    ),
    (
        "OODDetector",
        "Mahalanobis without labels",
        lambda: peg.OODDetector().fit(_model(), VAL[0]),
        ValueError,
        "labels",
    ),
    # issue 40, defect 12: a NaN reached the covariance (a raw _LinAlgError from eigh)
    (
        "OODDetector",
        "a NaN in val",
        lambda: peg.OODDetector().fit(_model(), (_with_nan(VAL[0]), VAL[1])),
        ValueError,
        r"val: the inputs contain NaN or inf \(1 of 400 samples\)",
    ),
    (
        "OODDetector",
        "a model that overflows on val",
        lambda: peg.OODDetector().fit(_overflowing(), VAL),
        ValueError,
        r"val: the model's outputs are NaN or inf for \d+ of 400 samples \(their inputs are "
        r"finite",
    ),
]
test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)


def _with_nan(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x[3, 1] = float("nan")
    return x


def _overflowing() -> nn.Module:
    model = _model()
    with torch.no_grad():
        model[0].weight.mul_(1e38)
    return model


# issue 40's silent gap: Mahalanobis on a singular covariance (4 points in 64 dimensions gave
# scores of ~1e8 without a word). Chosen: a warning at fit naming the rank and why (too few
# points, constant features), not a refusal: a feature constant at test time too changes no score.
# Issue 46: with ridge="auto" (the default) constant features (dead units) are no longer warned of,
# the data's floor covers them; too few points still are.
def test_mahalanobis_warns_of_a_singular_covariance():
    g = torch.Generator().manual_seed(0)
    model = nn.Linear(64, 2)
    few = torch.randn(4, 64, generator=g), torch.tensor([0, 1, 0, 1])
    few_points = (r"rank at most 2 of 64 \(4 points in 2 classes span at most 2\): in the other "
                  r"directions only the floor, Ledoit-Wolf's level")  # fmt: skip
    with pytest.warns(UserWarning, match=few_points):
        peg.OODDetector(features="inputs").fit(model, few)
    with pytest.warns(UserWarning, match=r"rank 2 of 64 \(4 points in 2 classes span at most 2"):
        det = peg.OODDetector(features="inputs", ridge=1e-6).fit(model, few)
    assert det.ood_score(torch.randn(5, 64, generator=g)).min() > 1e6  # what the warning says
    X = torch.randn(400, 64, generator=g)
    X[:, :3], X[:, 5] = 0.0, 2.0  # three zero features and a constant one
    y = torch.randint(0, 2, (400,), generator=g)
    with pytest.warns(UserWarning, match=r"rank 60 of 64 \(4 features are constant on val"):
        peg.OODDetector(features="inputs", ridge=1e-6).fit(model, (X, y))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the default: the floor covers them, no warning
        peg.OODDetector(features="inputs").fit(model, (X, y))
    X[:, :6] = torch.randn(400, 6, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # full rank: no warning
        peg.OODDetector(features="inputs", ridge=1e-6).fit(model, (X, y))


@pytest.fixture(scope="module")
def digits_mlp():
    """An ordinary MLP on scikit-learn's digits (900 training, 450 validation, 447 test
    images), with dead ReLU units on the validation set: 16 killed outright (bias -1000) beside
    the ones training leaves dead or rarely active."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = torch.tensor(digits.data, dtype=torch.float32) / 16
    y = torch.tensor(digits.target)
    order = torch.randperm(len(X), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                        nn.Linear(128, 10))  # fmt: skip
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    train = order[:900]
    for _ in range(150):
        opt.zero_grad()
        nn.functional.cross_entropy(net(X[train]), y[train]).backward()
        opt.step()
    with torch.no_grad():
        net[2].bias[:16] = -1000.0
    val, test = (X[order[900:1350]], y[order[900:1350]]), X[order[1350:]]
    noise = torch.rand(300, 64, generator=torch.Generator().manual_seed(1))
    return net.eval(), val, test, noise


def test_mahalanobis_default_ridge_on_an_mlp_with_dead_units(digits_mlp):
    """Issue 46's silent gap: the old default, 1e-6 of the mean variance, warned on every such
    model and let in-distribution scores reach thousands (a unit dead on val that a test image
    moves scores ~1e6 times its offset²). The default, Ledoit-Wolf's level as a floor under the
    eigenvalues: no warning, scores a fraction of those, detection at least as good."""
    net, val, test, noise = digits_mlp
    with torch.no_grad():
        dead = int((net[:4](val[0]).amax(0) == 0).sum())
    assert dead >= 16
    with pytest.warns(UserWarning, match=r"features are constant on val"):
        old = peg.OODDetector(ridge=1e-6).fit(net, val)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        det = peg.OODDetector().fit(net, val)
    assert 1e-4 < det.ridge_ < 1  # Ledoit-Wolf's level, of the mean variance
    before, now = old.ood_score(test), det.ood_score(test)
    assert float(now.max()) < float(before.max()) / 2
    assert float(now.median()) <= float(before.median())
    assert auroc(now, det.ood_score(noise)) >= auroc(before, old.ood_score(noise)) - 0.005
    assert auroc(now, det.ood_score(noise)) > 0.98


def test_the_ledoit_wolf_level_is_scikit_learns():
    from sklearn.covariance import ledoit_wolf_shrinkage

    from peg.detectors import ledoit_wolf_ridge

    rng = np.random.default_rng(0)
    for n, d in [(50, 10), (30, 100), (1000, 5)]:
        x = rng.standard_normal((n, d)) @ rng.standard_normal((d, d))
        x[:, :2] = 0.0
        x -= x.mean(0)
        delta = ledoit_wolf_shrinkage(x, assume_centered=True)
        ridge = ledoit_wolf_ridge(torch.tensor(x))
        assert ridge / (1 + ridge) == pytest.approx(delta, rel=1e-9)


@pytest.mark.parametrize("ood_score", ["mahalanobis", "knn", "energy"])
def test_compare_takes_the_feature_scores(ood_score):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 20), nn.ReLU(), nn.Linear(20, 2))
    model = overfit(net, *moons(200, 0), steps=200)
    far = torch.randn(100, 2, generator=torch.Generator().manual_seed(1)) * 5 + 8
    done = peg.compare(model, moons(300, 1), moons(200, 2), ["TS"], ood={"far": far},
                       ood_score=ood_score, say=None)  # fmt: skip
    row = done.table[0]
    assert 0 <= row["auroc (far)"] <= 1 and 0 <= row["fpr95 (far)"] <= 1
    if ood_score != "energy":
        assert row["auroc (far)"] > 0.9
    with pytest.raises(ValueError, match="ood_score: expected one of"):
        peg.compare(model, moons(300, 1), moons(200, 2), ["TS"], ood_score="odin", say=None)


def test_a_model_on_the_gpu_with_data_on_the_cpu(gpu):
    for score in ("mahalanobis", "knn"):
        a = peg.OODDetector(score=score, k=10).fit(_model().to(gpu), VAL)
        b = peg.OODDetector(score=score, k=10).fit(_model(), VAL)
        got = a.ood_score(FAR).to("cpu")
        torch.testing.assert_close(got, b.ood_score(FAR), rtol=1e-4, atol=1e-4)
