"""Selective classification: the risk–coverage curve, AURC, AUGRC and the risk at a coverage,
against literal NumPy loops over the definitions, sklearn's AUROC, numerical quadrature and
closed forms; ties, monotone transforms and the default confidence."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.integrate import quad
from sklearn.metrics import roc_auc_score

from peg import metrics
from peg.metrics import augrc, aurc, risk_at_coverage, risk_coverage_curve
from peg.metrics._predictive import Predictive, ranked
from peg.metrics.selective import risk_at_coverage_of


def probs(n: int, c: int, seed: int, quantised: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Dirichlet probabilities `[n, c]` (peaked) and labels; `quantised`: multiples of 1/8
    whose rows sum to 1 exactly (so renormalising keeps ties), many of them tied."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(c, 0.4), size=n)
    if quantised:
        p = np.floor(p * 8) / 8
        p[np.arange(n), p.argmax(1)] += 1 - p.sum(1)  # the remainder, exactly, on the maximum
    y = np.where(rng.random(n) < 0.7, p.argmax(1), rng.integers(0, c, n))  # ~70% correct
    return torch.from_numpy(p), torch.from_numpy(y)


def conf_correct(p: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    return p.max(1).values.numpy(), (p.argmax(1) == y).numpy()


def literal_curve(conf: np.ndarray, correct: np.ndarray) -> dict[str, np.ndarray]:
    """One point per distinct threshold t, by decreasing t: accept conf >= t."""
    rows = []
    for t in sorted(set(conf.tolist()), reverse=True):
        accepted = conf >= t
        wrong = int(np.sum(accepted & ~correct))
        rows.append((t, accepted.sum(), wrong))
    t, n, e = (np.array(c) for c in zip(*rows, strict=True))
    size = len(conf)
    return {"threshold": t, "coverage": n / size, "risk": e / n, "generalized_risk": e / size}


def interpolated_risk(curve: dict[str, np.ndarray]):
    """r(c) = g(c) / c with g linear through (0, 0) and the points (the module's definition)."""
    cov = np.r_[0.0, curve["coverage"]]
    g = np.r_[0.0, curve["generalized_risk"]]
    return lambda c: np.interp(c, cov, g) / c, cov


@pytest.mark.parametrize("quantised", [False, True])
def test_the_curve_is_the_literal_one(quantised):
    p, y = probs(400, 5, 0, quantised)
    conf, correct = conf_correct(p, y)
    ours, theirs = risk_coverage_curve(p, y), literal_curve(conf, correct)
    assert len(ours["coverage"]) == len(set(conf.tolist())) < (400 if quantised else 401)
    for key, value in theirs.items():
        np.testing.assert_allclose(ours[key].numpy(), value, rtol=1e-15, atol=0)
    assert ours["accepted"][-1] == 400 and ours["coverage"][-1] == 1
    assert ours["risk"][-1] == pytest.approx(metrics.error(p, y), abs=1e-15)


@pytest.mark.parametrize("quantised", [False, True])
def test_augrc_is_the_closed_form_of_auroc_and_accuracy(quantised):
    """Traub et al. 2024: AUGRC = acc·err·(1 − AUROC_f) + err²/2, AUROC_f of the confidence
    separating correct from wrong points (sklearn's, ties counted ½)."""
    for seed in range(3):
        p, y = probs(500, 4, seed, quantised)
        conf, correct = conf_correct(p, y)
        acc = correct.mean()
        expected = acc * (1 - acc) * (1 - roc_auc_score(correct, conf)) + (1 - acc) ** 2 / 2
        assert augrc(p, y) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("quantised", [False, True])
def test_aurc_is_the_integral_of_the_interpolated_risk(quantised):
    p, y = probs(300, 4, 1, quantised)
    curve = {k: v.numpy() for k, v in risk_coverage_curve(p, y).items()}
    r, cov = interpolated_risk(curve)
    area = curve["risk"][0] * cov[1]  # r is r₁ below the first point
    for a, b in itertools.pairwise(cov[1:]):
        area += quad(r, a, b, epsabs=1e-15, epsrel=1e-13)[0]
    assert aurc(p, y) == pytest.approx(area, rel=1e-10)
    # risk_at_coverage is that integrand
    pp = Predictive(p, y)
    for c in (0.013, 0.25, 0.5, 0.77, 0.999, 1.0):
        assert risk_at_coverage_of(pp.ranked, c) == pytest.approx(r(c), rel=1e-12)


@pytest.mark.parametrize("quantised", [False, True])
def test_linear_interpolation_is_the_trapezoid_over_the_points_risks(quantised):
    """fd-shifts' default AURC: np.trapz of the selective risks over the curve's points, from
    (0, r₁)."""
    p, y = probs(300, 4, 4, quantised)
    curve = literal_curve(*conf_correct(p, y))
    risks = np.r_[curve["risk"][0], curve["risk"]]
    coverage = np.r_[0.0, curve["coverage"]]
    expected = np.sum(np.diff(coverage) * (risks[1:] + risks[:-1]) / 2)
    assert aurc(p, y, interpolation="linear") == pytest.approx(expected, rel=1e-12)
    # an oracle whose errors tie: err²/2, not the exact err + (1 − err) ln(1 − err)
    correct = torch.from_numpy(conf_correct(p, y)[1]).double()
    err = 1 - float(correct.mean())
    assert aurc(p, y, confidence=correct, interpolation="linear") == pytest.approx(err**2 / 2)


def test_with_ties_aurc_is_the_average_over_the_orders_of_the_tied_points():
    conf = np.array([0.9, 0.9, 0.9, 0.7, 0.7, 0.5, 0.5, 0.5])
    correct = np.array([1, 0, 1, 0, 1, 1, 0, 0], dtype=bool)
    c, ok = torch.from_numpy(conf), torch.from_numpy(correct)
    grouped = ranked(c, ok)
    tied = [np.flatnonzero(conf == v) for v in (0.9, 0.7, 0.5)]
    areas = []
    for orders in itertools.product(*(itertools.permutations(g) for g in tied)):
        rank = np.empty(len(conf))
        rank[np.concatenate(orders)] = -np.arange(len(conf))  # distinct scores in that order
        areas.append(metrics.selective.aurc_of(ranked(torch.from_numpy(rank), ok)))
    assert metrics.selective.aurc_of(grouped) == pytest.approx(np.mean(areas), rel=1e-13)
    assert len(set(areas)) > 1  # the order of tied points matters to a per-point AURC


def test_an_oracle_has_the_closed_form_aurc_and_augrc():
    """Every correct point above every error: AURC = r + (1 − r) ln(1 − r), AUGRC = r²/2."""
    z = torch.randn(2, 1000, 3, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 3, (1000,), generator=torch.Generator().manual_seed(1))
    correct = Predictive(z, y).correct.double()
    r = 1 - float(correct.mean())
    optimal = r + (1 - r) * math.log(1 - r)
    jitter = torch.rand(1000, generator=torch.Generator().manual_seed(2)) / 2
    for score in (correct, correct + jitter, 5 * correct - jitter):  # tied, distinct, distinct
        assert aurc(z, y, confidence=score) == pytest.approx(optimal, rel=1e-12)
        assert augrc(z, y, confidence=score) == pytest.approx(r * r / 2, rel=1e-12)
    wrong_first = aurc(z, y, confidence=-correct)  # the worst ranking
    assert wrong_first > aurc(z, y) > optimal


def test_augrc_is_at_most_aurc_and_both_are_fractions():
    for seed in range(5):
        p, y = probs(200, 3, seed, quantised=seed % 2 == 1)
        a, g = aurc(p, y), augrc(p, y)
        assert 0 <= g <= a <= 1 and g <= 0.5
    p, y = probs(50, 3, 0)
    right = p.argmax(1)
    assert aurc(p, right) == augrc(p, right) == 0.0  # no error
    wrong = (right + 1) % 3
    assert aurc(p, wrong) == 1.0 and augrc(p, wrong) == 0.5  # every point wrong


def test_only_the_order_of_the_confidence_matters():
    p, y = probs(500, 6, 3)
    conf = p.max(1).values
    base = (aurc(p, y), augrc(p, y), risk_at_coverage(p, y, 0.8))
    for transform in (lambda c: 3 * c - 7, lambda c: torch.log(c / (1 - c + 1e-3)), torch.exp):
        score = transform(conf)
        got = (
            aurc(p, y, confidence=score),
            augrc(p, y, confidence=score),
            risk_at_coverage(p, y, 0.8, confidence=score),
        )
        assert got == base  # bit-equal: the metrics read counts, not scores
    order = torch.randperm(500, generator=torch.Generator().manual_seed(0))
    assert aurc(p[order], y[order]) == base[0]  # and not the order of the points


def test_the_default_confidence_is_the_ensembles_max_averaged_probability():
    z = 2 * torch.randn(4, 300, 5, generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 5, (300,), generator=torch.Generator().manual_seed(1))
    top = metrics.ensemble_probs(z).max(-1).values
    assert aurc(z, y) == pytest.approx(aurc(z, y, confidence=top), rel=1e-14)
    assert augrc(z, y) == pytest.approx(augrc(z, y, confidence=top), rel=1e-14)
    # any score: minus the predictive entropy, numpy arrays
    score = -metrics.entropy(z).numpy()
    assert 0 < aurc(z.numpy(), y.numpy(), confidence=score) < 1


def test_risk_at_coverage_counts_the_most_confident_points():
    p, y = probs(200, 4, 5)
    conf, correct = conf_correct(p, y)
    order = np.argsort(-conf, kind="stable")
    for k in (1, 20, 37, 150, 200):
        expected = 1 - correct[order[:k]].mean()
        assert risk_at_coverage(p, y, k / 200) == pytest.approx(expected, rel=1e-14, abs=1e-15)
    assert risk_at_coverage(p, y, 1) == pytest.approx(metrics.error(p, y), rel=1e-15)
    # a tie group at the cut counts its error rate per accepted point
    conf = torch.tensor([0.9, 0.6, 0.6, 0.6, 0.6, 0.55], dtype=torch.float64)
    pair = torch.stack([conf, 1 - conf], 1)
    labels = torch.tensor([0, 0, 1, 1, 0, 1])  # the 0.6 group: 2 of 4 wrong
    assert risk_at_coverage(pair, labels, 3 / 6) == pytest.approx((0 + 2 * 0.5) / 3, rel=1e-15)
    assert risk_at_coverage(pair, labels, 5 / 6) == pytest.approx(2 / 5, rel=1e-15)


def test_torch_uncertainty_s_convention_differs_by_order_one_over_n():
    """torch-uncertainty's AURC: the per-point risks at k/N, k = 1..N, the trapezoid over
    them, divided by 1 − 1/N (ties in sort order). Close to ours, not equal."""
    p, y = probs(400, 4, 7)
    conf, correct = conf_correct(p, y)
    errs = ~correct[np.argsort(-conf, kind="stable")]
    n = len(errs)
    risks = np.cumsum(errs) / np.arange(1, n + 1)
    theirs = np.sum((risks[1:] + risks[:-1]) / 2) / n / (1 - 1 / n)
    assert abs(aurc(p, y) - theirs) < 2 / n and aurc(p, y) != theirs


def test_bad_input_names_the_argument():
    p, y = probs(10, 3, 0)
    with pytest.raises(ValueError, match=r"confidence: .*shape \[10\]"):
        aurc(p, y, confidence=torch.zeros(9))
    with pytest.raises(ValueError, match=r"confidence: .*shape \[10\]"):
        augrc(p, y, confidence=torch.zeros(10, 3))
    with pytest.raises(ValueError, match="confidence: expected finite"):
        risk_coverage_curve(p, y, confidence=torch.full((10,), math.nan))
    with pytest.raises(ValueError, match="interpolation: expected 'exact' or 'linear'"):
        aurc(p, y, interpolation="spline")
    for bad in (0, -0.5, 1.5, math.nan, "0.5", True):
        with pytest.raises(ValueError, match=r"coverage: expected a number in \(0, 1\]"):
            risk_at_coverage(p, y, bad)
