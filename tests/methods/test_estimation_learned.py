"""auto's learned mode (issue 48): it learns the accuracy from shifted copies of the source
(`shifted=` sets, or corrupted copies of val's images through the model), falls back to the
gate from logits alone and says which in `Estimate.method`; its leave-one-family-out refit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import peg
from peg.methods.estimation import _learned
from peg.methods.estimation.estimators import Target

C = 5
MEANS = 2.0 * np.eye(C)
FAMILIES = ("gaussian_noise", "defocus_blur", "snow", "contrast")


def _sample(n: int, seed: int, spread: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian classes and the Bayes logits of the unshifted problem; `spread` < 1 moves the
    class means together: harder inputs, the same (now overconfident) model."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, C, n)
    x = spread * MEANS[y] + rng.standard_normal((n, C))
    return (x @ MEANS.T - 0.5 * (MEANS**2).sum(1)).astype(np.float32), y


def _shifted() -> list:
    """Shifted copies named as corruptions: severity s moves the means together by 0.12 · s."""
    sets = [("clean", *_sample(600, 10))]
    for i, name in enumerate(FAMILIES):
        for s in range(1, 6):
            sets.append((f"{name} {s}", *_sample(600, 11 + 5 * i + s, 1 - 0.12 * s)))
    return sets


@pytest.fixture(scope="module")
def learned() -> peg.PerformanceEstimator:
    est = peg.PerformanceEstimator(transport_points=200, reservoir=2000)
    return est.fit(*_sample(2000, 0), shifted=_shifted())


@pytest.fixture(scope="module")
def gate() -> peg.PerformanceEstimator:
    est = peg.PerformanceEstimator(transport_points=200, reservoir=2000)
    return est.fit(*_sample(2000, 0))


def test_learned_auto_moves_towards_the_truth_where_the_gate_opens(learned, gate):
    X, y = _sample(3000, 99, spread=0.4)
    truth = float((X.argmax(1) == y).mean())
    e, g = learned.estimate(X), gate.estimate(X)
    assert e.method == "auto (learned)" and g.method == "auto (gate)"
    assert learned.estimators_["auto"].learned.gate.weight(_target(learned, X)) > 0
    assert abs(e.accuracy - truth) < abs(g.accuracy - truth) - 0.01
    assert e.interval[0] <= e.accuracy <= e.interval[1]


def test_learned_auto_is_the_label_branch_where_the_gate_stays_shut(learned, gate):
    X, _ = _sample(3000, 98)
    assert learned.estimators_["auto"].learned.gate.weight(_target(learned, X)) == 0
    e = learned.estimate(X)
    label = (e.estimates["ac"] + e.estimates["atc-ls"]) / 2
    assert e.accuracy == pytest.approx(gate.estimate(X).accuracy, abs=1e-9)
    assert e.accuracy == pytest.approx(label, abs=1e-9)


def _target(est: peg.PerformanceEstimator, X: np.ndarray) -> Target:
    summary = est.summary()
    est.add(summary, torch.from_numpy(X))
    return Target(summary, est.source_)


def test_refit_without_a_family_never_sees_it(learned):
    fitted = learned.estimators_["auto"].learned
    assert set(fitted.families_) == {"noise", "blur", "weather", "digital", "other"}
    everyone = fitted.combiner[-1].coef_.copy()  # the ridge of the pipeline
    fitted.refit("noise")
    try:
        # the combiner changed and its errors are out of family: one per held family's set
        assert not np.allclose(fitted.combiner[-1].coef_, everyone)
        held = np.isin(fitted.families_, ["blur", "weather", "digital"]).sum()
        assert len(fitted.errors_) == held
    finally:
        fitted.refit(None)


def test_family_of_a_set_name():
    assert _learned.family("glass_blur 3") == "blur"
    assert _learned.family("jpeg_compression 5 + label shift 0") == "digital"
    assert _learned.family("clean + label shift 2") == "other"


class _Quadrants(nn.Module):
    """4 classes: the brightest quadrant of a 1 × 8 × 8 image (logits: 40 × its mean)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 40 * nn.functional.avg_pool2d(x, 4).flatten(1)


def test_a_model_and_images_learn_from_corrupted_copies(monkeypatch):
    monkeypatch.setattr(_learned, "corruptions", lambda channels: ("gaussian_noise", "contrast"))
    g = torch.Generator().manual_seed(0)
    X = torch.rand(400, 1, 8, 8, generator=g)
    model = _Quadrants()
    y = model(X).argmax(-1)
    flip = torch.rand(400, generator=g) < 0.2  # the model is right on about 85% of the points
    y[flip] = torch.randint(0, 4, (int(flip.sum()),), generator=g)
    est = peg.PerformanceEstimator(transport_points=100, reservoir=500, shift_points=100)
    est.fit(model, (X, y))
    fitted = est.estimators_["auto"].learned
    # clean + 2 corruptions × 5 severities, each also resampled once, the clean one 12 times
    assert len(fitted.accuracy_) == 1 + _learned.LABEL_SHIFTS + 2 * 5 * 2
    assert fitted.accuracy_.min() < fitted.accuracy_.max()  # the corruptions cost accuracy
    assert len(fitted.source.y) == 300  # the base estimators never saw the 100 copied points
    assert est.estimate(X[:50]).method == "auto (learned)"


def test_logits_only_fall_back_to_the_gate(gate):
    assert gate.estimators_["auto"].mode == "gate" and gate.estimators_["auto"].learned is None


@pytest.mark.parametrize(
    ("shifted", "match"),
    [
        ([("clean", np.zeros((10, C + 1)), np.zeros(10, dtype=int))], r"shifted: .*shape"),
        ([("clean", np.zeros((10, C)))], r"shifted: .*item 0 is not one"),
        ([], r"shifted: .*got none"),
    ],
)
def test_bad_shifted_sets_raise_one_clear_error(shifted, match):
    with pytest.raises(ValueError, match=match):
        peg.PerformanceEstimator().fit(*_sample(100, 0), shifted=shifted)
