"""`peg.evaluate` on saved logits of every kind: binary scores, a multi-label head's logits and
dense maps get their kind's metrics (read once by `read_kind`); multiclass logits as before."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import log_loss, roc_auc_score

import peg
from peg import metrics


def _scores(n: int = 400, k: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    shape = (n,) if k is None else (n, k)
    s = 2 * torch.randn(shape, generator=g)
    y = (torch.rand(shape, generator=g) < torch.sigmoid(0.6 * s)).long()  # over-confident
    return s, y


@pytest.mark.parametrize("column", [False, True])
def test_binary_scores_get_the_binary_metrics_on_p_of_class_one(column):
    s, y = _scores()
    y[::9] = -100
    keep = y != -100
    got = peg.evaluate(s[:, None] if column else s, y[:, None] if column else y)
    p = torch.sigmoid(s.double())
    assert got.keys() == set(metrics.BINARY_METRICS)
    assert got == pytest.approx(metrics.binary_metrics(p, y), rel=1e-9)
    assert got["nll"] == pytest.approx(log_loss(y[keep], p[keep]), rel=1e-9)
    assert got["auroc"] == pytest.approx(roc_auc_score(y[keep], s[keep]), rel=1e-12)
    assert got["ece"] > 0.03  # over-confident scores: a gap the metric sees


def test_saturated_binary_scores_keep_a_finite_nll():
    s = torch.tensor([60.0, -60.0, 1.0, -1.0], dtype=torch.float64)  # sigmoid rounds to 1 and 0
    y = torch.tensor([0, 1, 1, 0])
    assert peg.evaluate(s, y, metrics=["nll"])["nll"] == pytest.approx(
        (60 + 60 + 2 * np.log1p(np.exp(-1))) / 4
    )


def test_multilabel_logits_get_the_metrics_of_every_label_entry():
    s, y = _scores(300, 4)
    got = peg.evaluate(s.numpy(), y.numpy().astype(np.float32))  # float multi-hot, as BCE's
    expected = metrics.multilabel_metrics(torch.sigmoid(s.double()), y)
    assert got["label_ece"].shape == (4,)
    assert torch.allclose(got.pop("label_ece"), expected.pop("label_ece"))
    assert got == pytest.approx(expected, rel=1e-9)
    chosen = peg.evaluate(s, y, metrics=["ece", "label_ece"])
    assert list(chosen) == ["ece", "label_ece"]


def test_dense_maps_get_the_per_position_metrics_streamed_in_chunks():
    g = torch.Generator().manual_seed(1)
    logits = 3 * torch.randn(7, 5, 6, 8, generator=g)
    y = torch.randint(0, 5, (7, 6, 8), generator=g)
    y[:, :, 0] = 255
    got = peg.evaluate(logits, y, ignore_index=255, batch_size=2)
    assert got == pytest.approx(metrics.dense_metrics(logits, y, ignore_index=255), rel=1e-10)
    lm = peg.evaluate(logits.movedim(1, -1), y, ignore_index=255)  # [B, *S, C]: classes last
    assert lm == pytest.approx(got, rel=1e-10)


def test_a_shape_read_both_ways_is_settled_by_class_dim():
    logits = torch.randn(2, 5, 5)
    y = torch.randint(0, 5, (2, 5))
    with pytest.raises(ValueError, match="class_dim"):
        peg.evaluate(logits, y)
    first = peg.evaluate(logits, y, class_dim=1)
    last = peg.evaluate(logits, y, class_dim=-1)
    assert first["nll"] != pytest.approx(last["nll"])


def test_multiclass_logits_are_read_as_before_and_task_settles_the_reading():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(50, 3, generator=g)
    y = torch.randint(0, 3, (50,), generator=g)
    assert peg.evaluate(logits, y) == peg.metrics.classification_metrics(
        logits[None], y, metrics=["nll", "error", "brier", "ece", "mce"]
    )
    multi_hot = (torch.rand(50, 3, generator=g) < 0.5).long()
    with pytest.raises(ValueError, match="task: 'multiclass' needs labels"):
        peg.evaluate(logits, multi_hot, task="multiclass")
    with pytest.raises(ValueError, match="task: 'binary' needs one score per row"):
        peg.evaluate(logits, y, task="binary")
    named = np.array(["no", "yes"])[(logits[:, 0] > 0).long().numpy()]  # a scorer's classes
    scores = logits[:, 0] - logits[:, 1]
    assert peg.evaluate(scores, named, classes=["no", "yes"]) == peg.evaluate(
        scores, torch.as_tensor(named == "yes").long()
    )


def test_a_calibrator_fitted_on_another_kind_is_evaluated_as_that_kind():
    s, y = _scores(600)
    ts = peg.TemperatureScaling().fit(s[:300], y[:300])
    got = peg.evaluate(ts, s[300:], y[300:], batch_size=64)  # streamed through the calibrator
    expected = metrics.binary_metrics(ts.predict_proba(s[300:]), y[300:])
    assert got == pytest.approx(expected, rel=1e-6)
    assert got["nll"] < peg.evaluate(s[300:], y[300:])["nll"]  # calibrated: a real change

    g = torch.Generator().manual_seed(3)
    maps = 4 * torch.randn(12, 3, 5, 5, generator=g)
    noise = torch.randint(0, 3, (12, 5, 5), generator=g)
    pixels = torch.where(torch.rand(12, 5, 5, generator=g) < 0.3, noise, maps.argmax(1))
    pixels[:, 0] = -100
    dense = peg.TemperatureScaling().fit(maps[:6], pixels[:6])
    got = peg.evaluate(dense, (maps[6:], pixels[6:]), batch_size=4)
    calibrated = dense.member_logits(maps[6:])[0]  # [B, C, H, W]
    assert got == pytest.approx(metrics.dense_metrics(calibrated, pixels[6:]), rel=1e-10)
