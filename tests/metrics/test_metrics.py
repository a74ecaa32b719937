"""Classification metrics: values against references and hand computations, and input checks."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss

from peg import metrics
from peg.metrics import (
    accuracy,
    brier,
    check_labels,
    classification_metrics,
    ece,
    ensemble_log_probs,
    error,
    gibbs_nll,
    mce,
    member_nll,
    nll,
    reliability,
)


def random_probs(n: int, c: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.dirichlet(np.ones(c), size=n)), torch.from_numpy(
        rng.integers(0, c, size=n)
    )


def binary(conf: list[float] | torch.Tensor) -> torch.Tensor:
    """Probabilities [N, 2] whose class-0 probability is `conf`."""
    p0 = torch.as_tensor(conf, dtype=torch.float64)
    return torch.stack([p0, 1 - p0], dim=1)


# --- NLL -------------------------------------------------------------------------------------


def test_nll_of_probabilities_matches_sklearn() -> None:
    p, y = random_probs(200, 4)
    assert nll(p, y) == pytest.approx(log_loss(y.numpy(), p.numpy(), labels=range(4)), rel=1e-10)


def test_nll_of_single_member_logits_matches_sklearn_on_softmax() -> None:
    z = torch.randn(1, 100, 5) * 3
    y = torch.randint(0, 5, (100,))
    expected = log_loss(y.numpy(), z[0].double().softmax(-1).numpy(), labels=range(5))
    assert nll(z, y) == pytest.approx(expected, rel=1e-6)


def test_ensemble_nll_matches_naive_formula_on_moderate_logits() -> None:
    z = torch.randn(5, 100, 3, dtype=torch.float64) * 2
    y = torch.randint(0, 3, (100,))
    naive = -z.softmax(-1).mean(0).log()[torch.arange(100), y].mean()
    assert nll(z, y) == pytest.approx(float(naive), rel=1e-12)


def test_ensemble_nll_is_exact_on_saturated_logits() -> None:
    # Both members put ~0 on the true class 0: log p_m(0) = -2000 and -1000, so
    # p̄(0) = (e^-2000 + e^-1000) / 2 and nll = 1000 + log 2 - log1p(e^-1000) = 1000 + log 2.
    z = torch.tensor([[[-1000.0, 1000.0]], [[-500.0, 500.0]]], dtype=torch.float64)
    y = torch.tensor([0])
    naive = -z.softmax(-1).mean(0).log()[0, 0]
    assert math.isinf(naive)  # log(mean(softmax)) underflows
    assert nll(z, y) == pytest.approx(1000 + math.log(2), rel=1e-12)
    # One member is sure and right, the other sure and wrong: p̄(true) = 1/2, nll = log 2.
    z = torch.tensor([[[1000.0, -1000.0]], [[-1000.0, 1000.0]]])
    assert nll(z, y) == pytest.approx(math.log(2), rel=1e-12)
    assert ensemble_log_probs(z).exp().sum().item() == pytest.approx(1.0)


def test_nll_zero_probability_on_true_class_is_inf_not_nan() -> None:
    p = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)
    assert nll(p, torch.tensor([1, 0])) == math.inf
    assert nll(p, torch.tensor([0, 0])) == pytest.approx(
        math.log(2) / 2
    )  # a zero elsewhere is fine


def test_gibbs_nll_bounds_ensemble_nll() -> None:
    for seed in range(5):
        g = torch.Generator().manual_seed(seed)
        z = torch.randn(4, 50, 3, generator=g) * 3
        y = torch.randint(0, 3, (50,), generator=g)
        assert gibbs_nll(z, y) >= nll(z, y)  # Jensen
        assert member_nll(z, y).shape == (4,)
        assert gibbs_nll(z, y) == pytest.approx(float(member_nll(z, y).mean()))
    same = z[:1].expand(3, -1, -1)
    assert gibbs_nll(same, y) == pytest.approx(nll(same, y), rel=1e-12)
    assert member_nll(z[:1], y)[0].item() == pytest.approx(nll(z[:1], y), rel=1e-12)


# --- error, Brier --------------------------------------------------------------------------


def test_error_and_accuracy() -> None:
    p = binary([0.9, 0.2, 0.6, 0.4])  # predicted classes 0, 1, 0, 1
    y = torch.tensor([0, 1, 1, 1])  # one mistake out of four
    assert error(p, y) == 0.25
    assert accuracy(p, y) == 0.75


def test_error_uses_averaged_probabilities_not_majority_vote() -> None:
    # Two members say class 0 with 0.51, one says class 1 with ~1: p̄(0) = 1.02 / 3 < 0.5.
    p = torch.tensor([[[0.51, 0.49]], [[0.51, 0.49]], [[1e-6, 1 - 1e-6]]], dtype=torch.float64)
    assert error(p.log(), torch.tensor([1])) == 0.0


def test_brier_hand_computed() -> None:
    p = torch.tensor([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], dtype=torch.float64)
    y = torch.tensor([0, 1])
    # row 0: (0.7 - 1)² + 0.2² + 0.1² = 0.09 + 0.04 + 0.01 = 0.14
    # row 1: 0.1² + (0.3 - 1)² + 0.6² = 0.01 + 0.49 + 0.36 = 0.86
    # mean = (0.14 + 0.86) / 2 = 0.5; normalised by C = 3: 0.5 / 3
    assert brier(p, y) == pytest.approx(0.5)
    assert brier(p, y, normalize=True) == pytest.approx(0.5 / 3)
    # Same for member logits that reproduce p.
    assert brier(p.log().unsqueeze(0), y) == pytest.approx(0.5)


# --- calibration -----------------------------------------------------------------------------

# 5 bins: (0, .2], (.2, .4], (.4, .6], (.6, .8], (.8, 1]; binary, so confidence >= 0.5.
CAL_P = binary([0.55, 0.35, 0.75, 0.9, 1.0, 0.05])  # confidences .55 .65 .75 .9 1 .95
CAL_Y = torch.tensor([0, 0, 0, 0, 0, 0])  # correct: yes, no, yes, yes, yes, no
# bin 2: {.55}           count 1, conf .55, acc 1,   gap .45
# bin 3: {.65, .75}      count 2, conf .70, acc 1/2, gap .20
# bin 4: {.9, 1, .95}    count 3, conf .95, acc 2/3, gap .95 - 2/3 = .28333
# ECE = (1 * .45 + 2 * .20 + 3 * .28333) / 6 = (.45 + .40 + .85) / 6 = 1.7 / 6
# MCE = .45
# min_count=2 drops bin 2: ECE = (.40 + .85) / 6 = 1.25 / 6 (N stays 6), MCE = .28333


def test_reliability_hand_computed() -> None:
    r = reliability(CAL_P, CAL_Y, bins=5)
    torch.testing.assert_close(r["edges"], torch.tensor([0, 0.2, 0.4, 0.6, 0.8, 1.0]).double())
    assert r["count"].tolist() == [0, 0, 1, 2, 3]
    assert r["count"].dtype == torch.int64
    assert torch.isnan(r["confidence"][:2]).all() and torch.isnan(r["accuracy"][:2]).all()
    torch.testing.assert_close(r["confidence"][2:], torch.tensor([0.55, 0.70, 0.95]).double())
    torch.testing.assert_close(r["accuracy"][2:], torch.tensor([1.0, 0.5, 2 / 3]).double())


def test_ece_mce_hand_computed() -> None:
    assert ece(CAL_P, CAL_Y, bins=5) == pytest.approx(1.7 / 6)
    assert mce(CAL_P, CAL_Y, bins=5) == pytest.approx(0.45)
    assert ece(CAL_P, CAL_Y, bins=5, min_count=2) == pytest.approx(1.25 / 6)
    assert mce(CAL_P, CAL_Y, bins=5, min_count=2) == pytest.approx(0.95 - 2 / 3)
    assert ece(CAL_P, CAL_Y, bins=5, min_count=4) == 0.0  # no bin qualifies
    assert mce(CAL_P, CAL_Y, bins=5, min_count=4) == 0.0


def test_confidence_one_is_in_last_bin_and_edges_go_to_lower_bin() -> None:
    y = torch.tensor([0])
    assert reliability(binary([1.0]), y, bins=5)["count"].tolist() == [0, 0, 0, 0, 1]
    assert reliability(binary([0.6]), y, bins=5)["count"].tolist() == [0, 0, 1, 0, 0]
    assert reliability(binary([0.8]), y, bins=5)["count"].tolist() == [0, 0, 0, 1, 0]
    uniform = torch.full((1, 5), 0.2, dtype=torch.float64)  # confidence exactly 0.2
    assert reliability(uniform, y, bins=5)["count"].tolist() == [1, 0, 0, 0, 0]
    assert reliability(uniform, y, bins=15)["count"].argmax().item() == 2  # 0.2 = 3/15
    # 0.55 = 11/20 closes bin 10 of 20; edges from torch.linspace(0, 1, 21) would have
    # 0.5499999999999999 there and put it in bin 11. Edges are i / bins, correctly rounded.
    assert reliability(binary([0.55]), y, bins=20)["count"].argmax().item() == 10
    assert reliability(binary([0.7]), y, bins=10)["count"].argmax().item() == 6
    assert reliability(binary([0.5]), y, bins=1)["count"].tolist() == [1]


def test_perfectly_calibrated_synthetic_has_small_ece() -> None:
    g = torch.Generator().manual_seed(0)
    conf = 0.5 + 0.5 * torch.rand(20000, generator=g, dtype=torch.float64)
    y = (torch.rand(20000, generator=g, dtype=torch.float64) >= conf).long()  # P(y=0) = conf
    r = reliability(binary(conf), y)
    assert int(r["count"].sum()) == 20000
    assert ece(binary(conf), y) < 0.02
    # An over-confident predictor (confidence pushed towards 1) is not.
    assert ece(binary((conf + 1) / 2), y) > 0.1


def test_reliability_counts_sum_to_n_for_member_logits() -> None:
    z = torch.randn(3, 257, 10) * 4
    y = torch.randint(0, 10, (257,))
    r = reliability(z, y, bins=7)
    assert r["edges"].shape == (8,) and r["confidence"].shape == (7,)
    assert int(r["count"].sum()) == 257
    assert 0.0 <= ece(z, y) <= mce(z, y) <= 1.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_predicted_class_is_the_first_maximum_in_every_float_dtype(dtype) -> None:
    """The argmax runs on the bits read as integers: ties go to the first class, -0.0 and 0.0
    are not the maximum, as with `max` on the float64 probabilities."""
    p = torch.tensor(
        [[0.25, 0.375, 0.375, 0.0], [-0.0, 0.5, 0.0, 0.5], [0.0, 0.0, 0.0, 1.0], [0.25] * 4]
    ).to(dtype)
    y = torch.tensor([2, 3, 3, 0])
    # Predicted 1, 1, 3, 0 with confidences .375, .5, 1, .25: wrong, wrong, right, right.
    assert error(p, y) == 0.5
    r = reliability(p, y, bins=4)
    assert r["count"].tolist() == [1, 2, 0, 1]
    assert r["accuracy"][[0, 1, 3]].tolist() == [1.0, 0.0, 1.0]


def test_ece_and_mce_agree_with_torchmetrics() -> None:
    """An independent implementation (left-closed bins, which differ only on an edge; its
    result is float32)."""
    tm = pytest.importorskip("torchmetrics.functional.classification")
    p, y = random_probs(5000, 7, seed=3)
    for norm, ours in (("l1", ece), ("max", mce)):
        theirs = float(tm.multiclass_calibration_error(p, y, 7, 15, norm))
        assert ours(p, y) == pytest.approx(theirs, abs=1e-6)


# --- all together, numpy, float32 ----------------------------------------------------------


def test_classification_metrics_keys_and_values() -> None:
    p, y = random_probs(60, 3)
    out = classification_metrics(p, y, bins=10)
    assert set(out) == {"nll", "error", "brier", "ece", "mce"}
    assert out["nll"] == nll(p, y) and out["ece"] == ece(p, y, bins=10)
    z = torch.randn(4, 60, 3)
    out = classification_metrics(z, y, min_count=2)
    assert set(out) == {"nll", "error", "brier", "ece", "mce", "gibbs_nll"}
    assert all(isinstance(v, float) for v in out.values())
    assert out["gibbs_nll"] == gibbs_nll(z, y) and out["mce"] == mce(z, y, min_count=2)


def test_numpy_and_float32_inputs() -> None:
    p, y = random_probs(40, 3)
    p_np, y_np = p.numpy(), y.numpy()
    assert nll(p_np, y_np) == nll(p, y)
    assert brier(p_np, y_np) == brier(p, y)
    assert ece(p_np.astype(np.float32), y_np) == pytest.approx(ece(p, y), abs=1e-6)
    assert error(p, y.double()) == error(p, y)  # integer-valued float labels are accepted
    z = np.random.default_rng(0).normal(size=(2, 40, 3)).astype(np.float32)
    assert gibbs_nll(z, y_np) == pytest.approx(gibbs_nll(torch.from_numpy(z).double(), y))
    assert set(metrics.classification_metrics(z, list(y_np))) >= {"nll", "gibbs_nll"}


# --- bad input -----------------------------------------------------------------------------

P3 = torch.tensor([[0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
Y3 = torch.tensor([2, 0])


@pytest.mark.parametrize(
    ("pred", "y", "match"),
    [
        (P3, torch.tensor([0, 3]), r"y: expected labels in \[0, 3\).*min 0 and max 3"),
        (P3, torch.tensor([-1, 0]), r"y: expected labels in \[0, 3\).*min -1"),
        (P3, torch.tensor([0.5, 1.0]), r"y: expected integer labels"),
        (P3, torch.tensor([0.0, float("nan")]), r"y: expected integer labels"),
        (P3, torch.tensor([[0], [1]]), r"y: expected integer labels of shape \[2\]"),
        (P3, torch.tensor([0, 1, 2]), r"y: expected 2 labels"),
        (P3 * 2, Y3, r"pred: .*rows do not sum to 1.*\[M, N, C\].*unsqueeze\(0\)"),
        (torch.tensor([[1.5, -0.5]]), torch.tensor([0]), r"pred: .*negative values.*unsqueeze"),
        (torch.tensor([[float("nan"), 1.0]]), torch.tensor([0]), r"pred: expected finite"),
        (torch.full((1, 2, 2), float("inf")), torch.tensor([0, 1]), r"pred: expected finite"),
        (torch.zeros(0, 3), torch.zeros(0, dtype=torch.long), r"pred: expected N >= 1"),
        (torch.zeros(0, 2, 3), Y3, r"pred: expected M >= 1"),
        (
            torch.tensor([0.2, 0.3, 0.5]),
            Y3,
            r"pred: expected probabilities \[N, C\] or member logits \[M, N, C\], "
            r"got shape \(3,\)",
        ),
        (torch.zeros(1, 1, 2, 3), Y3, r"pred: expected .* got shape \(1, 1, 2, 3\)"),
    ],
)
@pytest.mark.parametrize("metric", [nll, error, brier, ece, reliability, classification_metrics])
def test_bad_input_raises_naming_the_argument(metric, pred, y, match) -> None:
    with pytest.raises(ValueError, match=match):
        metric(pred, y)


def test_gibbs_nll_needs_member_logits() -> None:
    with pytest.raises(ValueError, match=r"member_logits: expected member logits \[M, N, C\]"):
        gibbs_nll(P3, Y3)
    with pytest.raises(ValueError, match=r"member_logits: expected finite"):
        member_nll(torch.full((1, 2, 3), float("nan")), Y3)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"bins": 0}, "bins"), ({"bins": 2.5}, "bins"), ({"min_count": 0}, "min_count")],
)
def test_bad_bins_and_min_count(kwargs, name) -> None:
    with pytest.raises(ValueError, match=name):
        ece(P3, Y3, **kwargs)
    with pytest.raises(ValueError, match=name):
        mce(P3, Y3, **kwargs)


def test_check_labels() -> None:
    assert check_labels(np.array([0, 2]), 2, 3).dtype == torch.int64
    with pytest.raises(ValueError, match="y: expected at least one label"):
        check_labels(torch.zeros(0, dtype=torch.long), 0, 3)
