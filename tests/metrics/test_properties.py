"""Property-based tests (hypothesis) of every metric: bounds, invariances, streaming = one-shot.

Inputs are small random member logits `[M, N, C]` in [-30, 30] (their softmax gives the
probabilities `[N, C]` form) and labels in [0, C). Equalities that reorder floating-point sums
are checked to 1e-9; bounds allow 1e-12 of rounding.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from peg import metrics
from peg.metrics import diversity
from peg.metrics.streaming import StreamingMetrics, StreamingOOD

SETTINGS = settings(max_examples=50, deadline=None, database=None)
EPS = 1e-12  # rounding allowed at a bound
TOL = 1e-9  # equal up to the order of a floating-point sum
LOGIT = st.floats(-30, 30, allow_nan=False, allow_infinity=False, width=64)
# Logits on a 1/8 grid: exact ties or gaps >= 1/8, so an argmax cannot flip by an ulp of rounding.
GRID_LOGIT = st.integers(-240, 240).map(lambda k: k / 8)
# ECE bins whose edges k/7 are none of the tie confidences 1/2 .. 1/5 (see the identical-members
# test: a confidence exactly on an edge may change bins by an ulp of rounding).
BINS = 7


def _close(a: float, b: float, tol: float = TOL) -> bool:
    return math.isclose(a, b, rel_tol=tol, abs_tol=tol)


@st.composite
def problems(draw, max_m: int = 4, max_n: int = 24, max_c: int = 5, elements=LOGIT):
    """Member logits `[M, N, C]` float64 and labels `[N]` int64."""
    m = draw(st.integers(1, max_m))
    n = draw(st.integers(1, max_n))
    c = draw(st.integers(2, max_c))
    z = draw(arrays(np.float64, (m, n, c), elements=elements))
    y = draw(arrays(np.int64, (n,), elements=st.integers(0, c - 1)))
    return torch.from_numpy(z), torch.from_numpy(y)


def _probs(z: torch.Tensor) -> torch.Tensor:
    """The probabilities `[N, C]` form of member logits: the mean member softmax."""
    return z.softmax(-1).mean(0)


@st.composite
def splits(draw, n: int):
    """Cut points 0 < c_1 < ... < n: a random split of n rows into consecutive batches."""
    cuts = draw(st.sets(st.integers(1, n - 1), max_size=min(n - 1, 6))) if n > 1 else set()
    return [0, *sorted(cuts), n]


# --- bounds ------------------------------------------------------------------------------------


@SETTINGS
@given(problems(), st.booleans())
def test_classification_metrics_stay_in_their_ranges(problem, as_probs):
    z, y = problem
    pred = _probs(z) if as_probs else z
    C = z.shape[-1]
    assert metrics.nll(pred, y) >= -EPS
    assert 0.0 <= metrics.error(pred, y) <= 1.0
    assert 0.0 <= metrics.accuracy(pred, y) <= 1.0
    assert -EPS <= metrics.brier(pred, y) <= 2.0 + EPS
    assert -EPS <= metrics.brier(pred, y, normalize=True) <= 2.0 / C + EPS
    for bins in (1, 7, 15):
        ece, mce = metrics.ece(pred, y, bins), metrics.mce(pred, y, bins)
        assert 0.0 <= ece <= 1.0 and 0.0 <= mce <= 1.0
        assert ece <= mce + EPS  # a count-weighted mean of gaps is at most their maximum
        assert metrics.ece(pred, y, bins, min_count=3) <= ece + EPS  # dropping bins only lowers it
        r = metrics.reliability(pred, y, bins)
        assert int(r["count"].sum()) == len(y)
    if not as_probs:
        assert metrics.gibbs_nll(z, y) >= metrics.nll(z, y) - TOL  # Jensen


@SETTINGS
@given(problems(max_m=1))
def test_one_member_perfect_prediction_scores_zero(problem):
    """Logits that put +30 on the label and -30 elsewhere: error 0, NLL ~ 0, Brier ~ 0."""
    _, y = problem
    z = torch.full((1, len(y), int(y.max()) + 2), -30.0, dtype=torch.float64)
    z[0, torch.arange(len(y)), y] = 30.0
    assert metrics.error(z, y) == 0.0
    assert 0.0 <= metrics.nll(z, y) < 1e-20
    assert metrics.brier(z, y) < 1e-40
    assert metrics.ece(z, y) < 1e-20


# --- invariance to the order of the samples -------------------------------------------------


@SETTINGS
@given(problems(), st.booleans(), st.randoms(use_true_random=False))
def test_classification_metrics_do_not_depend_on_sample_order(problem, as_probs, rnd):
    z, y = problem
    perm = list(range(len(y)))
    rnd.shuffle(perm)
    pred = _probs(z) if as_probs else z
    shuffled = pred[perm] if as_probs else pred[:, perm]
    a = metrics.classification_metrics(pred, y)
    b = metrics.classification_metrics(shuffled, y[perm])
    assert a.keys() == b.keys()
    assert a["error"] == b["error"]  # a count: exact
    for k in a:
        assert _close(a[k], b[k]), (k, a[k], b[k])


# --- an ensemble of identical members is the member -------------------------------------------


@SETTINGS
@given(problems(max_m=1, elements=GRID_LOGIT), st.integers(2, 5))
def test_identical_members_equal_the_single_member(problem, m):
    """`[M, N, C]` with M identical rows == `[1, N, C]` == its softmax `[N, C]`.

    Logits are on a 1/8 grid and ECE uses 7 bins, so a last-ulp difference between the three
    routes (log-space mean over M copies, log-softmax, softmax) can neither flip an argmax nor
    move a confidence across a bin edge (ties give confidences 1/k, never k'/7).
    """
    z, y = problem
    forms = {"members": z.expand(m, -1, -1), "single": z, "probs": z[0].softmax(-1)}
    for name, pred in forms.items():
        for f in (metrics.nll, metrics.brier):
            assert _close(f(pred, y), f(z, y)), (name, f.__name__)
        assert metrics.error(pred, y) == metrics.error(z, y), name
        assert _close(metrics.ece(pred, y, BINS), metrics.ece(z, y, BINS)), name
        assert _close(metrics.mce(pred, y, BINS), metrics.mce(z, y, BINS)), name
    assert _close(metrics.gibbs_nll(forms["members"], y), metrics.nll(z, y))
    assert float(metrics.mutual_information(forms["members"]).max()) <= EPS


# --- streaming = one-shot ------------------------------------------------------------------------


@SETTINGS
@given(st.data(), problems(), st.booleans(), st.sampled_from([1, 7, 15]), st.integers(1, 3))
def test_streaming_metrics_equal_the_one_shot_metrics(data, problem, as_probs, bins, min_count):
    z, y = problem
    pred = _probs(z) if as_probs else z
    cuts = data.draw(splits(len(y)))
    stream = StreamingMetrics(bins=bins, min_count=min_count)
    for lo, hi in itertools.pairwise(cuts):
        stream.update(pred[lo:hi] if as_probs else pred[:, lo:hi], y[lo:hi])
    got = stream.compute()
    want = metrics.classification_metrics(pred, y, bins, min_count)
    assert got.keys() == want.keys()
    assert got["error"] == want["error"]
    for k in want:
        assert _close(got[k], want[k]), (k, got[k], want[k], cuts)


def test_probabilities_within_the_sum_tolerance_keep_the_documented_ranges():
    p = torch.tensor([[0.0, 1.0009]], dtype=torch.float64)  # row sum 1.0009: accepted
    assert metrics.ece(p, [0]) <= 1.0  # was 1.0009 before rows were renormalised
    assert metrics.mce(p, [0]) <= 1.0
    assert metrics.brier(p, [0]) <= 2.0
    assert metrics.nll(p, [1]) >= 0.0


# --- OOD detection -------------------------------------------------------------------------------


@st.composite
def distinct_scores(draw, max_n: int = 20):
    """(scores_in, scores_out) with no value repeated anywhere (tie-free)."""
    n_in, n_out = draw(st.integers(1, max_n)), draw(st.integers(1, max_n))
    s = draw(arrays(np.float64, (n_in + n_out,), elements=LOGIT, unique=True))
    return s[:n_in], s[n_in:]


@SETTINGS
@given(distinct_scores())
def test_auroc_is_in_range_and_swapping_the_classes_complements_it(scores):
    s_in, s_out = scores
    a, b = metrics.auroc(s_in, s_out), metrics.auroc(s_out, s_in)
    assert 0.0 <= a <= 1.0
    assert _close(a + b, 1.0, 1e-12)
    # Negating the scores reverses the ranking: the same complement.
    assert _close(metrics.auroc(-s_in, -s_out), b, 1e-12)
    for positive in ("ood", "in"):
        # AUPR may exceed 1 by an ulp: sklearn's average precision sums recall steps, e.g.
        # 1.0000000000000002 for scores_in [0], scores_out [1, ..., 20] (not clamped by peg).
        assert 0.0 <= metrics.aupr(s_in, s_out, positive) <= 1.0 + EPS
        assert 0.0 <= metrics.fpr_at_tpr(s_in, s_out, 0.95, positive) <= 1.0


@SETTINGS
@given(LOGIT, st.integers(1, 15), st.integers(1, 15))
def test_auroc_of_all_equal_scores_is_one_half(v, n_in, n_out):
    assert metrics.auroc(np.full(n_in, v), np.full(n_out, v)) == 0.5


@SETTINGS
@given(st.data(), problems(max_n=16), problems(max_n=16))
def test_streaming_ood_equals_the_one_shot_ood_metrics(data, problem_in, problem_out):
    z_in, _ = problem_in
    z_out, _ = problem_out
    c = min(z_in.shape[-1], z_out.shape[-1])
    m = min(z_in.shape[0], z_out.shape[0])
    z_in, z_out = z_in[:m, :, :c], z_out[:m, :, :c]
    score = data.draw(st.sampled_from(sorted(metrics.OOD_SCORES)))
    stream = StreamingOOD(score)
    for z, ood in ((z_in, False), (z_out, True)):
        cuts = data.draw(splits(z.shape[1]))
        for lo, hi in itertools.pairwise(cuts):
            stream.update(z[:, lo:hi], ood=ood)
    got = stream.compute()
    want = metrics.ood_metrics(z_in, z_out, score)
    assert got == want
    assert 0.0 <= got["auroc"] <= 1.0 and 0.0 <= got["fpr95"] <= 1.0


def test_streaming_ood_rejects_batches_with_another_number_of_classes():
    with pytest.raises(ValueError, match="classes"):
        metrics.ood_metrics(torch.zeros(1, 5, 3), torch.zeros(1, 5, 7))  # one-shot: refused
    stream = StreamingOOD("entropy")
    stream.update(torch.zeros(1, 5, 3), ood=False)
    with pytest.raises(ValueError, match="classes"):
        stream.update(torch.zeros(1, 5, 7), ood=True)
        stream.compute()  # {"auroc": 1.0, ...} from entropies of 3 vs 7 classes


@SETTINGS
@given(problems())
def test_ood_scores_stay_in_their_ranges(problem):
    z, _ = problem
    M, _, C = z.shape
    msp = metrics.max_softmax(z)
    assert bool(((msp >= -1 - EPS) & (msp <= -1 / C + EPS)).all())
    h = metrics.entropy(z)
    assert bool(((h >= -EPS) & (h <= math.log(C) + EPS)).all())
    mi = metrics.mutual_information(z)
    assert bool(((mi >= 0) & (mi <= math.log(M) + EPS) & (mi <= h + EPS)).all())
    vr = metrics.variation_ratio(z)
    assert bool(((vr >= 0) & (vr <= 1 - 1 / M + EPS)).all())


# --- regression ----------------------------------------------------------------------------------


@st.composite
def gaussians(draw, max_m: int = 4, max_n: int = 24):
    """Member means `[M, N]`, variances `[M, N]` in [1e-3, 1e3], targets `[N]`."""
    m, n = draw(st.integers(1, max_m)), draw(st.integers(1, max_n))
    mean = draw(arrays(np.float64, (m, n), elements=LOGIT))
    log_var = draw(arrays(np.float64, (m, n), elements=st.floats(-3, 3)))
    y = draw(arrays(np.float64, (n,), elements=LOGIT))
    return torch.from_numpy(mean), torch.from_numpy(10.0**log_var), torch.from_numpy(y)


@SETTINGS
@given(gaussians(max_m=1), st.booleans())
def test_one_member_lpd_is_minus_the_gaussian_nll(g, flat):
    mean, var, y = g
    if flat:  # one model's [N] means and variances
        mean, var = mean[0], var[0]
    lpd = metrics.log_predictive_density(mean, var, y)
    assert _close(lpd, -metrics.gaussian_nll(mean, var, y))
    assert _close(
        metrics.log_predictive_density(mean, var, y, y_scale=2.5),
        -metrics.gaussian_nll(mean, var, y, y_scale=2.5),
    )


@SETTINGS
@given(gaussians(), st.randoms(use_true_random=False))
def test_regression_metrics_are_order_invariant_and_in_range(g, rnd):
    mean, var, y = g
    perm = list(range(len(y)))
    rnd.shuffle(perm)
    a = metrics.regression_metrics(mean, var, y)
    b = metrics.regression_metrics(mean[:, perm], var[:, perm], y[perm])
    assert a.keys() == b.keys()
    for k in a:
        assert _close(a[k], b[k]), (k, a[k], b[k])
    assert a["rmse"] >= 0.0
    assert 0.0 <= a["calibration_error"] <= 1.0
    cov = metrics.interval_coverage(mean, var, y, (0.1, 0.5, 0.9))
    assert bool(((cov >= 0) & (cov <= 1)).all()) and bool((cov.diff() >= 0).all())
    # Per point, log((1/M) sum_m p_m) >= mean_m log p_m (Jensen) and >= max_m log p_m - log M.
    lpds = [metrics.log_predictive_density(mean[i], var[i], y) for i in range(len(mean))]
    slack = TOL * (1 + max(abs(v) for v in lpds))
    assert a["lpd"] >= sum(lpds) / len(lpds) - slack
    assert a["lpd"] >= max(lpds) - math.log(len(lpds)) - slack


@SETTINGS
@given(gaussians())
def test_rmse_of_identical_members_is_that_of_one_member(g):
    mean, _, y = g
    one = metrics.rmse(mean[0], y)
    assert one >= 0.0
    assert _close(metrics.rmse(mean[:1].expand(3, -1), y), one)


# --- diversity -----------------------------------------------------------------------------------


@SETTINGS
@given(problems(max_m=5).filter(lambda p: p[0].shape[0] >= 2))
def test_disagreement_is_symmetric_with_zero_diagonal_and_in_range(problem):
    z, y = problem
    d = diversity.disagreement(z)
    M = z.shape[0]
    assert d.shape == (M, M)
    assert torch.equal(d, d.T)
    assert torch.equal(d.diagonal(), torch.zeros(M, dtype=d.dtype))
    assert bool(((d >= 0) & (d <= 1)).all())
    kl = diversity.pairwise_kl(z)
    assert bool((kl >= 0).all()) and float(kl.diagonal().abs().max()) <= 1e-9
    assert diversity.jensen_shannon(z) >= 0.0
    nd = diversity.normalized_disagreement(z, y)
    assert bool((nd >= 0).all()) and bool((nd.diagonal() == 0).all())
    # Sample order does not matter.
    perm = torch.randperm(z.shape[1], generator=torch.Generator().manual_seed(0))
    assert torch.equal(diversity.disagreement(z[:, perm]), d)
