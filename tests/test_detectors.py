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
def test_mahalanobis_warns_of_a_singular_covariance():
    g = torch.Generator().manual_seed(0)
    model = nn.Linear(64, 2)
    few = torch.randn(4, 64, generator=g), torch.tensor([0, 1, 0, 1])
    with pytest.warns(UserWarning, match=r"rank 2 of 64 \(4 points in 2 classes span at most 2"):
        det = peg.OODDetector(features="inputs").fit(model, few)
    assert det.ood_score(torch.randn(5, 64, generator=g)).min() > 1e6  # what the warning says
    X = torch.randn(400, 64, generator=g)
    X[:, :3], X[:, 5] = 0.0, 2.0  # three zero features and a constant one
    y = torch.randint(0, 2, (400,), generator=g)
    with pytest.warns(UserWarning, match=r"rank 60 of 64 \(4 features are constant on val"):
        peg.OODDetector(features="inputs").fit(model, (X, y))
    X[:, :6] = torch.randn(400, 6, generator=g)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # full rank: no warning
        peg.OODDetector(features="inputs").fit(model, (X, y))


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
