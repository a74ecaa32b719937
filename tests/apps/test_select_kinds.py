"""AutoSelect on saved logits of every kind (binary scores, multilabel heads, dense maps): the
candidates are the maps that take the kind, the scores are the kind's (the uncalibrated
baseline's NLL is `peg.evaluate`'s), the choice predicts in the input's shape and saves."""

from __future__ import annotations

import pytest
import torch

import peg
from peg.apps.select.folds import stratified_folds
from peg.methods.calibration._calibrator import calibrators


def _binary(n: int = 240, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, generator=g) * 2
    y = (torch.rand(n, generator=g) < torch.sigmoid(z)).long()
    return z * 2.5 + 0.5, y  # over-confident and shifted: calibration helps


def _multilabel(n: int = 90, k: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    z = torch.randn(n, k, generator=g) * 2
    y = (torch.rand(n, k, generator=g) < torch.sigmoid(z)).long()
    return z * 2.0, y


def _dense(b: int = 30, c: int = 3, s: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    z = torch.randn(b, c, s, s, generator=g) * 2
    y = torch.multinomial(z.movedim(1, -1).reshape(-1, c).softmax(-1), 1, generator=g)
    y = y.reshape(b, s, s)
    y[:, 0, :2] = 255  # VOC's and Cityscapes' ignored label
    return z * 2.0, y


CASES = {
    "binary": (_binary, {}, "binary"),
    "multilabel": (_multilabel, {}, "multilabel"),
    "dense": (_dense, {"ignore_index": 255}, "dense"),
}


def _select(logits, y, **options):
    return peg.AutoSelect(cv=3, max_fit_seconds=None, progress=False, **options).fit(logits, y)


@pytest.mark.parametrize("case", list(CASES))
def test_autoselect_on_each_kind(case):
    make, options, kind = CASES[case]
    logits, y = make()
    auto = _select(logits, y, **options)
    names = [r["candidate"] for r in auto.report_]
    assert names == [c.name for c in calibrators(kind)]  # the registry's, no list of our own
    assert all(r["status"] != "dropped" for r in auto.report_), auto.report_
    # the points are the kind's rows not ignored, and the baseline's NLL is the kind's NLL
    ignored = int((y == options.get("ignore_index", -100)).sum())
    assert auto.verdict_.points == y.numel() - ignored
    expected = peg.evaluate(logits, y, **options)["nll"]
    assert auto.verdict_.before == pytest.approx(expected, rel=1e-5)
    assert auto.verdict_.after < auto.verdict_.before  # the logits are miscalibrated
    best = min(r["cv_mean"] for r in auto.report_)
    chosen = next(r for r in auto.report_ if r["candidate"] == auto.chosen_)
    assert chosen["cv_mean"] <= best + chosen["cv_se"] + 1e-12  # best, or within one SE of it
    # the choice predicts in the input's shape, as the refitted map does
    p = auto.predict_proba(logits)
    assert p.shape == logits.shape
    assert torch.allclose(p, auto.predictor_.predict_proba(logits))
    assert auto.predictor_.kind_.kind == kind
    # evaluated as its kind, as its chosen map is
    mine, chosen_map = (peg.evaluate(p, logits, y, **options) for p in (auto, auto.predictor_))
    assert mine["nll"] == chosen_map["nll"] and mine["ece"] == chosen_map["ece"]
    assert auto.predict(logits).shape == (logits.shape if kind != "dense" else y.shape)


def test_autoselect_binary_saves_and_loads(tmp_path):
    logits, y = _binary()
    auto = _select(logits, y)
    path = auto.save(tmp_path / "chosen.peg")
    loaded = peg.load(path)
    assert loaded.kind_.kind == "binary"
    assert torch.allclose(loaded.predict_proba(logits), auto.predict_proba(logits), atol=1e-6)


def test_autoselect_binary_candidates_given_and_scored_as_binary_nll():
    # one candidate: its cross-fitted mean is the mean binary NLL of its out-of-fold P(y = 1)
    logits, y = _binary(300, seed=3)
    ts = calibrators("binary")[0]
    auto = _select(logits, y, candidates=[ts.name])
    assert auto.chosen_ == ts.name
    oof = torch.zeros(len(y), dtype=torch.float64)
    folds = stratified_folds(y, 3, 0)
    for f, held in enumerate(folds):
        train = torch.cat([folds[j] for j in range(3) if j != f])
        fitted = ts().fit(logits[train], y[train])
        p = fitted.predict_proba(logits[held]).double()
        oof[held] = -torch.where(y[held] == 1, p, 1 - p).log()
    assert auto.report_[0]["cv_mean"] == pytest.approx(float(oof.mean()), rel=1e-4)


def test_autoselect_multiclass_is_unchanged():
    g = torch.Generator().manual_seed(4)
    logits, y = torch.randn(150, 3, generator=g) * 3, torch.randint(0, 3, (150,), generator=g)
    auto = _select(logits, y, candidates=[calibrators("multiclass")[0].name])
    assert auto.verdict_.points == 150
    assert auto.predict_proba(logits).shape == (150, 3)
    assert getattr(auto.predictor_, "kind_", None) is None or auto.predictor_.kind_.kind == (
        "multiclass"
    )


def test_autoselect_nested_refuses_another_kind():
    logits, y = _binary()
    with pytest.raises(ValueError, match="nested"):
        _select(logits, y, nested=True)
