"""Venn-ABERS: [p0, p1] equal to scikit-learn's isotonic regression refitted with the test
point labelled 0 and 1 (ties, scores beyond the calibration set), p0 <= merged <= p1, the
validity of p_y under exchangeability, a multilabel head's intervals `[N, K, 2]`, multiclass
refused, save/load and `to_module`."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.isotonic import IsotonicRegression

import peg
from bad_inputs import raises_test
from peg.errors import ArchiveError


def scores(s: np.ndarray | torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(s, dtype=torch.float64)


def brute_force(s: np.ndarray, y: np.ndarray, t: float) -> tuple[float, float]:
    """(p0, p1) at t: isotonic regression refitted with (t, 0) and with (t, 1) added."""
    fits = []
    for label in (0, 1):
        iso = IsotonicRegression(out_of_bounds="clip")
        iso.fit(np.append(s, t), np.append(y, label))
        fits.append(float(iso.predict([t])[0]))
    return fits[0], fits[1]


def scorer(n: int, rng: np.random.Generator, decimals: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Over-confident scores rounded (ties) and labels drawn from sigmoid(s / 2)."""
    s = np.round(3 * rng.normal(size=n), decimals)
    return s, (rng.random(n) < 1 / (1 + np.exp(-s / 2))).astype(np.int64)


@pytest.mark.parametrize("seed", range(6))
def test_the_interval_is_the_isotonic_fits_with_the_test_point_added(seed):
    rng = np.random.default_rng(seed)
    s, y = scorer(int(rng.integers(2, 40)), rng)
    if seed == 0:
        y[:] = 1 - y[0]  # keep both labels but make the fit nearly constant
        y[0] = 1 - y[1]
    va = peg.VennAbers().fit(scores(s), torch.as_tensor(y))
    # the calibration scores (ties), new ones, and beyond both ends
    tests = np.concatenate([s, np.round(4 * rng.normal(size=15), 1), [s.min() - 1, s.max() + 1]])
    interval = va.predict_interval(scores(tests)).numpy()
    expected = np.array([brute_force(s, y, t) for t in tests])
    np.testing.assert_allclose(interval, expected, rtol=0, atol=1e-12)


def test_p0_merged_p1_in_order_and_the_merged_formula():
    rng = np.random.default_rng(7)
    s, y = scorer(500, rng, decimals=2)
    va = peg.VennAbers().fit(scores(s), torch.as_tensor(y))
    t = scores(np.linspace(-12, 12, 301))
    p0, p1 = va.predict_interval(t).unbind(-1)
    p = va.predict_proba(t).double()
    assert bool((p0 <= p1).all()) and bool((p0 < 1).all()) and bool((p1 > 0).all())
    torch.testing.assert_close(p, p1 / (1 - p0 + p1), atol=1e-6, rtol=0)
    assert bool((p0 - 1e-6 <= p).all()) and bool((p <= p1 + 1e-6).all())
    assert bool((p.diff() >= -1e-6).all())  # monotone in the score, as the isotonic fits


def test_p_of_the_true_label_is_calibrated_under_exchangeability():
    """Venn predictors' validity: with the calibration set and the test point exchangeable,
    E[y | p_y] = p_y, p_y the bound of the true label (p1 for y = 1, p0 for y = 0): checked
    in four bins of p_y (the bound of the other label is off by 0.24-0.32 at the ends)."""
    rng = np.random.default_rng(3)
    chosen, labels, widths = [], [], []
    for _ in range(300):
        s, y = scorer(40, rng, decimals=3)  # 30 to calibrate, 10 to test, exchangeable
        va = peg.VennAbers().fit(scores(s[:30]), torch.as_tensor(y[:30]))
        p0, p1 = va.predict_interval(scores(s[30:])).unbind(-1)
        truth = torch.as_tensor(y[30:]).double()
        chosen.append(torch.where(truth > 0, p1, p0))
        labels.append(truth)
        widths.append(p1 - p0)
    p, y = torch.cat(chosen), torch.cat(labels)
    bins = (4 * p).clamp(max=3.999).long()
    for k in range(4):
        error = (y - p)[bins == k]
        assert len(error) > 300
        assert abs(float(error.mean())) < 4 * float(error.std()) / len(error) ** 0.5 + 0.02
    assert float(torch.cat(widths).mean()) > 0.1  # a real interval at 30 points


def test_save_load_and_the_exported_module_give_the_same_probabilities(tmp_path):
    rng = np.random.default_rng(1)
    s, y = scorer(300, rng)
    va = peg.VennAbers().fit(scores(s), torch.as_tensor(y))
    loaded = peg.load(va.save(tmp_path / "va.peg"))
    assert type(loaded) is peg.VennAbers
    t = scores(np.round(4 * rng.normal(size=200), 1)).float()
    torch.testing.assert_close(loaded.predict_interval(t), va.predict_interval(t))
    torch.testing.assert_close(loaded.predict_proba(t), va.predict_proba(t))
    module = va.to_module()
    torch.testing.assert_close(module(t), va.predict_proba(t), atol=1e-6, rtol=0)


def test_a_multilabel_head_gets_intervals_per_entry_shared_or_per_label():
    rng = np.random.default_rng(5)
    columns = [scorer(300, rng) for _ in range(3)]
    logits = torch.as_tensor(np.stack([s for s, _ in columns], 1), dtype=torch.float64)
    labels = torch.as_tensor(np.stack([y for _, y in columns], 1))
    shared = peg.VennAbers().fit(logits[:200], labels[:200])
    flat = peg.VennAbers().fit(logits[:200].reshape(-1), labels[:200].reshape(-1))
    interval = shared.predict_interval(logits[200:])
    assert interval.shape == (100, 3, 2)
    torch.testing.assert_close(
        interval.reshape(-1, 2), flat.predict_interval(logits[200:].reshape(-1))
    )
    own = peg.VennAbers(per_label=True).fit(logits[:200], labels[:200])
    interval = own.predict_interval(logits[200:])
    for k in range(3):  # label k's interval is the one of its column alone
        alone = peg.VennAbers().fit(logits[:200, k], labels[:200, k])
        torch.testing.assert_close(interval[:, k], alone.predict_interval(logits[200:, k]))
    assert isinstance(own.predict_interval(logits[200:].numpy()), np.ndarray)


def test_per_label_maps_save_load_and_export(tmp_path):
    rng = np.random.default_rng(6)
    columns = [scorer(200, rng) for _ in range(2)]
    logits = torch.as_tensor(np.stack([s for s, _ in columns], 1), dtype=torch.float32)
    labels = torch.as_tensor(np.stack([y for _, y in columns], 1))
    va = peg.VennAbers(per_label=True).fit(logits[:150], labels[:150])
    loaded = peg.load(va.save(tmp_path / "labels.peg"))
    test = logits[150:]
    torch.testing.assert_close(loaded.predict_interval(test), va.predict_interval(test))
    torch.testing.assert_close(loaded.predict_proba(test), va.predict_proba(test))
    module = va.to_module()
    torch.testing.assert_close(module(test), va.predict_proba(test), atol=1e-6, rtol=0)


def _multiclass() -> None:
    g = torch.Generator().manual_seed(0)
    peg.VennAbers().fit(torch.randn(30, 3, generator=g), torch.arange(30) % 3)


def _bad_tables(tmp_path) -> None:
    rng = np.random.default_rng(1)
    s, y = scorer(50, rng)
    va = peg.VennAbers().fit(scores(s), torch.as_tensor(y))
    va.p0_ = va.p0_.flip(0) + 1  # p0 >= 1: no merged probability
    peg.load(va.save(tmp_path / "bad.peg"))


ERROR_CASES = [
    ("calibrators", "Venn-ABERS on three-class logits", _multiclass, ValueError,
     r"val: VennAbers does not take multiclass input .*it takes binary, multilabel"),
]  # fmt: skip
FILE_ERROR_CASES = [
    ("load", "a Venn-ABERS archive whose p0 reaches 1", _bad_tables, ArchiveError,
     r"calibration: 'p0' and 'p1' must hold 0 <= p0 <= p1 <= 1"),
]  # fmt: skip
test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
test_bad_file_raises_a_clear_error = raises_test(FILE_ERROR_CASES, files=True)
