"""Issue 46, item 5: `n_knots` of spline calibration and order-preserving scaling bounded before
the work it sizes: a ValueError naming `n_knots` and the memory, not the allocator's raw error
after 38 s (`OrderPreservingScaling(n_knots=10**6)`: 8 TB) or numpy's 8 GB of quantiles
(`n_knots=2**31`). The memory is fixed at 8 GB (`_memory.available_memory`), as in
tests/test_archive_trust.py: a larger machine would otherwise allocate and run."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import peg
from peg.utils import memory as _memory


@pytest.fixture
def eight_gb(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_memory, "available_memory", lambda device: 8 * 10**9)


def _logits(n: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(n, classes, generator=g) * 3
    return z, torch.multinomial(z.softmax(-1), 1, generator=g)[:, 0]


@pytest.mark.parametrize("n_knots", [10**6, 2**31])
def test_order_preserving_with_a_million_knots_names_n_knots(eight_gb, n_knots):
    """The knots are distinct quantiles of the scores (at most ~11,000 here): the moments of
    the Newton step `[N, K + 1, K + 1]` would need terabytes; refused before the fit."""
    started = time.perf_counter()
    with pytest.raises(ValueError, match=rf"n_knots: {n_knots:,} would need \d+(\.\d+)? TB \(the "
                       r"Newton step's moments of \d+ distinct knots on 1000 rows\), more than "
                       r"the 8 GB available on cpu; give fewer knots"):  # fmt: skip
        peg.OrderPreservingScaling(n_knots=n_knots).fit(nn.Identity(), _logits(1000, 10))
    assert time.perf_counter() - started < 30  # was 38 s, then the allocator (a loose bound)


def test_order_preserving_keeps_the_distinct_knots_the_scores_allow():
    """More knots than the scores can place: the distinct quantiles, fitted (documented)."""
    z, y = _logits(40, 3)
    ops = peg.OrderPreservingScaling(n_knots=10**4).fit(nn.Identity(), (z, y))
    assert 2 <= len(ops.knots_) <= 40 * 3 + 40 and bool((ops.knots_.diff() > 0).all())
    assert torch.isfinite(ops.predict_proba(z)).all()


def test_spline_with_1e5_knots_names_n_knots(eight_gb):
    """10⁵ knots on 10⁵ points: a basis of 400 GB, refused before it is built (the
    allocator's raw error before)."""
    expected = (r"n_knots: 100,000 would need 400 GB \(the spline basis of 100000 points, "
                r"float64\), more than the 8 GB available on cpu")  # fmt: skip
    with pytest.raises(ValueError, match=expected):
        peg.SplineCalibration(n_knots=10**5).fit(nn.Identity(), _logits(10**5, 3))


def test_spline_with_more_knots_than_points_names_n_knots():
    with pytest.raises(ValueError, match=r"n_knots=500 needs at least that many validation "
                       r"points, got 100"):  # fmt: skip
        peg.SplineCalibration(n_knots=500).fit(nn.Identity(), _logits(100, 3))
