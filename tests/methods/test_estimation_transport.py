"""COT's transport (issue 48): the transportation solver over C classes
(`_transport.transport_labels`, behind `_stats.transport_cost`) gives the same optimal plan as
scipy's assignment on the label columns repeated by their counts, ties and rounded
capacities included."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from peg.errors import InvalidParameterError
from peg.methods.estimation._stats import transport_cost
from peg.methods.estimation._transport import transport_labels


def _counts(priors: np.ndarray, m: int) -> np.ndarray:
    """The largest-remainder rounding `transport_cost` documents, written out again."""
    counts = np.floor(priors * m).astype(np.int64)
    rest = np.argsort(-(priors * m - counts), kind="stable")[: m - counts.sum()]
    counts[rest] += 1
    return counts


def _assignment(cost: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The reference: the per-point costs `[m]` of scipy's m × m assignment."""
    full = cost[:, np.repeat(np.arange(len(counts)), counts)]
    r, c = linear_sum_assignment(full)
    return full[r, c]


def _case(seed: int, m: int, classes: int, ties: bool) -> tuple[np.ndarray, np.ndarray]:
    """Log-probabilities `[m, C]` (some collapsed onto class 0; rounded logits and repeated
    rows when `ties`) and a Dirichlet(0.5) label marginal: m · prior is never an integer."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(m, classes)) * rng.uniform(0.5, 6.0)
    logits[: m // 3, 0] += 4.0
    if ties:
        logits = np.round(logits)
        logits[m // 2 : m // 2 + m // 5] = logits[m // 2]
    lp = logits - np.logaddexp.reduce(logits, axis=1, keepdims=True)
    return lp, rng.dirichlet(np.full(classes, 0.5))


@pytest.mark.parametrize("classes", [2, 10, 100])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("ties", [False, True])
def test_transport_total_equals_the_assignment(classes, seed, ties):
    m = {2: 300, 10: 400, 100: 600}[classes] + 17 * seed
    lp, priors = _case(seed, m, classes, ties)
    counts = _counts(priors, m)
    cost = 1.0 - np.exp(lp)
    labels = transport_labels(cost, counts)
    assert (np.bincount(labels, minlength=classes) == counts).all()  # the capacities hold
    got, want = cost[np.arange(m), labels], _assignment(cost, counts)
    assert abs(got.sum() - want.sum()) <= 1e-9
    if not ties:  # a unique optimal plan: the same cost point by point (what COTT reads)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize(("classes", "m"), [(10, 400), (100, 600)])
def test_transport_cost_takes_the_solver_or_the_assignment(classes, m):
    """C ≤ m / 20: the solver; above: scipy's assignment. Both the optimal plan, per point."""
    lp, priors = _case(5, m, classes, False)
    want = _assignment(1.0 - np.exp(lp), _counts(priors, m))
    np.testing.assert_allclose(transport_cost(lp, priors, m, 0), want, rtol=0, atol=1e-12)


def test_transport_with_a_zero_capacity_and_one_class():
    lp, priors = _case(4, 400, 10, False)
    priors[3] = 0.0  # a class no label is drawn from
    priors /= priors.sum()
    got = transport_cost(lp, priors, 1000, 0)
    assert abs(got.sum() - _assignment(1.0 - np.exp(lp), _counts(priors, 400)).sum()) <= 1e-9
    assert (transport_labels(np.zeros((5, 1)), np.array([5])) == 0).all()


def test_transport_refuses_counts_that_do_not_sum_to_the_points():
    with pytest.raises(InvalidParameterError, match="counts"):
        transport_labels(np.zeros((5, 2)), np.array([2, 2]))  # would loop: 1 point unplaced
