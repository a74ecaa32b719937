"""Metrics of binary scorers, multi-label heads and dense predictions: against scikit-learn and
direct formulas, `ignore_index` leaving entries out, the dense stream equal to the one-shot
multi-class metrics of the positions."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

from peg import metrics
from peg.metrics.calibration import bin_sums
from peg.metrics.dense import DenseMetrics, dense_metrics, dense_rows


def _binary(n: int = 500, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, generator=g, dtype=torch.float64)
    y = (torch.rand(n, generator=g, dtype=torch.float64) < p**1.5).long()  # miscalibrated
    return p, y


def _ece_by_loops(p: np.ndarray, y: np.ndarray, bins: int) -> float:
    """Equal-width bins on [0, 1], right-closed, the first also holding 0 (peg's binning)."""
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        at = (p > lo) & (p <= hi) if b else (p >= lo) & (p <= hi)
        if at.any():
            total += at.sum() / len(p) * abs(y[at].mean() - p[at].mean())
    return total


def test_binary_metrics_agree_with_scikit_learn_and_the_formulas():
    p, y = _binary()
    got = metrics.binary_metrics(p, y, bins=10)
    assert got["nll"] == pytest.approx(log_loss(y.numpy(), p.numpy()), rel=1e-10)
    assert got["brier"] == pytest.approx(brier_score_loss(y.numpy(), p.numpy()), rel=1e-10)
    assert got["auroc"] == pytest.approx(roc_auc_score(y.numpy(), p.numpy()), rel=1e-12)
    assert got["ece"] == pytest.approx(_ece_by_loops(p.numpy(), y.numpy(), 10), rel=1e-10)
    assert got["error"] == pytest.approx(float(((p > 0.5).long() != y).double().mean()))
    assert got["ece"] > 0.02  # the labels were drawn miscalibrated: a real gap is measured


def test_binary_auroc_counts_ties_as_scikit_learn_does():
    p = torch.tensor([0.2, 0.2, 0.5, 0.5, 0.5, 0.9])  # ties across the classes
    y = torch.tensor([0, 1, 0, 1, 1, 0])
    assert metrics.binary_auroc(p, y) == pytest.approx(roc_auc_score(y, p), rel=1e-12)


def test_ignore_index_leaves_the_entries_out_and_one_column_equals_a_vector():
    p, y = _binary(300, seed=1)
    left = y.clone()
    left[::7] = -100
    keep = left != -100
    full = metrics.binary_metrics(p, left)
    assert full == pytest.approx(metrics.binary_metrics(p[keep], y[keep]))
    assert metrics.binary_metrics(p[:, None], left[:, None]) == pytest.approx(full)
    with pytest.raises(ValueError, match="ignore_index=5"):  # -100 is then a bad label
        metrics.binary_nll(p, left, ignore_index=5)
    assert metrics.binary_ece(p, y.float()) == pytest.approx(metrics.binary_ece(p, y))


def test_binary_reliability_is_the_diagram_data_on_p_of_class_one():
    p, y = _binary(400, seed=2)
    r = metrics.binary_reliability(p, y, bins=5)
    assert int(r["count"].sum()) == 400 and r["edges"].tolist() == [0, 0.2, 0.4, 0.6, 0.8, 1]
    first = p <= 0.2
    assert r["confidence"][0] == pytest.approx(float(p[first].mean()))
    assert r["accuracy"][0] == pytest.approx(float(y[first].double().mean()))


def test_grouped_bin_sums_are_each_groups_own():
    g = torch.Generator().manual_seed(3)
    conf = torch.rand(200, generator=g, dtype=torch.float64)
    hit = torch.rand(200, generator=g) < 0.5
    group = torch.randint(0, 3, (200,), generator=g)
    grouped = bin_sums(conf, hit, 7, group, 3)
    for k in range(3):
        alone = bin_sums(conf[group == k], hit[group == k], 7)
        for a, b in zip(grouped, alone, strict=True):
            assert torch.allclose(a[k].double(), b.double())


def _multilabel(n: int = 400, k: int = 5, seed: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, k, generator=g, dtype=torch.float64)
    sharpness = torch.linspace(0.5, 2.0, k, dtype=torch.float64)  # each label its own gap
    y = (torch.rand(n, k, generator=g, dtype=torch.float64) < p**sharpness).long()
    return p, y


def test_multilabel_metrics_are_the_binary_ones_over_every_entry():
    p, y = _multilabel()
    y[::5, 2] = -100
    got = metrics.multilabel_metrics(p, y, bins=10)
    flat = metrics.binary_metrics(p.flatten(), y.flatten(), bins=10)
    for key in ("nll", "brier", "ece", "mce", "error"):
        assert got[key] == pytest.approx(flat[key], rel=1e-10), key
    each = [metrics.binary_ece(p[:, k], y[:, k], bins=10) for k in range(5)]
    assert got["label_ece"].tolist() == pytest.approx(each, rel=1e-10)
    assert got["label_ece"].std() > 0.01  # the labels differ: per-label values can disagree
    assert metrics.label_ece(p, y, bins=10).tolist() == pytest.approx(each, rel=1e-10)
    assert metrics.multilabel_nll(p, y) == pytest.approx(flat["nll"])


def test_multilabel_reliability_pooled_and_per_label():
    p, y = _multilabel(200, 3)
    pooled = metrics.multilabel_reliability(p, y, bins=4)
    per = metrics.multilabel_reliability(p, y, bins=4, per_label=True)
    assert per["count"].shape == (3, 4) and torch.equal(per["count"].sum(0), pooled["count"])
    one = metrics.binary_reliability(p[:, 1], y[:, 1], bins=4)
    assert torch.allclose(per["accuracy"][1], one["accuracy"], equal_nan=True)


def test_a_label_with_every_entry_ignored_has_no_ece():
    p, y = _multilabel(100, 3)
    y[:, 1] = -100
    ece = metrics.label_ece(p, y)
    assert ece[1].isnan() and not ece[[0, 2]].isnan().any()


def _dense(seed: int = 5, shape: tuple[int, ...] = (6, 4, 9, 11)):
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(*shape, generator=g)
    y = torch.randint(0, shape[1], (shape[0], *shape[2:]), generator=g)
    y[torch.rand(y.shape, generator=g) < 0.2] = -100
    return logits, y


@pytest.mark.parametrize("shape", [(6, 4, 9, 11), (5, 3, 17), (3, 4, 2, 3, 5)])
def test_dense_streamed_over_batches_equals_the_one_shot_metrics_of_the_positions(shape):
    logits, y = _dense(shape=shape)
    keep = y != -100
    rows = logits.movedim(1, -1)[keep]  # every position not ignored, classes last
    expected = {
        "nll": metrics.nll(rows[None], y[keep]),
        "error": metrics.error(rows[None], y[keep]),
        "brier": metrics.brier(rows[None], y[keep]),
        "ece": metrics.ece(rows[None], y[keep]),
        "mce": metrics.mce(rows[None], y[keep]),
    }
    stream = DenseMetrics()
    for idx in torch.arange(shape[0]).split(2):
        stream.update(logits[idx], y[idx])
    got = stream.compute()
    assert got.keys() == expected.keys()
    for k in expected:
        assert got[k] == pytest.approx(expected[k], rel=1e-10, abs=1e-12), k
    assert dense_metrics(logits, y) == pytest.approx(got, rel=1e-10, abs=1e-12)


def test_dense_state_does_not_grow_and_ignored_positions_do_not_count():
    logits, y = _dense()
    stream = DenseMetrics()
    for _ in range(10):
        stream.update(logits, y)
    state = stream.stream
    assert [t.numel() for t in (state.bin_count, state.bin_conf, state.bin_correct)] == [15] * 3
    assert state.n == 10 * int((y != -100).sum())
    everything = y.clone()
    everything[y == -100] = 0  # the same positions, none ignored: other numbers
    assert dense_metrics(logits, everything)["nll"] != pytest.approx(
        dense_metrics(logits, y)["nll"]
    )
    assert dense_metrics(logits, y.masked_fill(y == -100, 255), ignore_index=255) == pytest.approx(
        dense_metrics(logits, y)
    )


def test_dense_members_average_the_members_probabilities():
    logits, y = _dense(shape=(4, 3, 5, 5))
    members = torch.stack([logits, 0.5 * logits])
    stream = DenseMetrics(members=True)
    stream.update(members, y)
    rows, labels = dense_rows(members, y, members=True)
    assert rows.shape == (2, int((y != -100).sum()), 3)
    assert stream.compute()["nll"] == pytest.approx(metrics.nll(rows, labels), rel=1e-12)


def test_dense_batches_all_ignored_add_nothing():
    logits, y = _dense(shape=(2, 3, 4, 4))
    stream = DenseMetrics()
    stream.update(logits, torch.full_like(y, -100))
    stream.update(logits, y)
    assert stream.compute() == pytest.approx(dense_metrics(logits, y))


def test_dense_classes_last_as_a_language_models_logits():
    logits, y = _dense(shape=(3, 7, 12))  # [B, C, T]
    last = logits.movedim(1, -1).contiguous()  # [B, T, V]
    assert dense_metrics(last, y, class_dim=-1) == pytest.approx(dense_metrics(logits, y))
    with pytest.raises(ValueError, match=r"y: expected labels \[B, \*S\] = \[3, 12\]"):
        dense_metrics(last, y.T.contiguous(), class_dim=-1)


def test_multiclass_metrics_leave_out_the_labels_ignored():
    g = torch.Generator().manual_seed(8)
    logits = 2 * torch.randn(3, 200, 4, generator=g)
    y = torch.randint(0, 4, (200,), generator=g)
    left = y.clone()
    left[::3] = -100
    keep = left != -100
    assert metrics.nll(logits, left) == pytest.approx(metrics.nll(logits[:, keep], y[keep]))
    probs = logits[0].softmax(-1)
    assert metrics.classification_metrics(
        probs, left.masked_fill(~keep, 255), ignore_index=255
    ) == (metrics.classification_metrics(probs[keep], y[keep]))
    conf = torch.rand(200, generator=g)
    assert metrics.aurc(probs, left, confidence=conf) == metrics.aurc(
        probs[keep], y[keep], confidence=conf[keep]
    )
    stream = metrics.streaming.StreamingMetrics()
    stream.update(logits[:, :50], torch.full((50,), -100))  # padding only: adds nothing
    stream.update(logits[:, 50:], left[50:])
    expected = metrics.classification_metrics(logits[:, 50:][:, keep[50:]], y[50:][keep[50:]])
    assert stream.compute() == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match=r"every label is ignore_index \(-100\)"):
        metrics.ece(probs, torch.full((200,), -100))
