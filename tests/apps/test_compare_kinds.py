"""peg.compare on saved logits of every kind: the rows are the model and the maps that take the
kind (the registry's), every row is scored by the kind's own metrics (`peg.evaluate`'s), and the
report renders."""

from __future__ import annotations

import pytest
from test_select_kinds import CASES

import peg
from peg.methods.calibration._calibrator import calibrators


@pytest.mark.parametrize("case", list(CASES))
def test_compare_on_each_kind(case):
    make, options, kind = CASES[case]
    logits, y = make()
    h = len(y) // 2
    test = (logits[h:], y[h:])
    result = peg.compare(logits[:h], y[:h], test, progress=False, say=None, **options)
    rows = {r["method"]: r for r in result.table}
    assert list(rows)[1:] == [c.name for c in calibrators(kind)]
    assert not [r for r in rows.values() if r.get("failed")]
    model = peg.evaluate(*test, **options)
    for key in ("nll", "brier", "ece", "error"):
        assert rows["Model"][key] == pytest.approx(model[key], rel=1e-5, abs=1e-9), key
    for name, row in rows.items():  # each map's row is its own predictor's evaluation
        if name == "Model":
            continue
        mine = peg.evaluate(result.predictors[name], *test, **options)
        assert row["nll"] == pytest.approx(mine["nll"], rel=1e-5), name
    assert min(r["nll"] for r in rows.values()) < rows["Model"]["nll"]  # miscalibrated
    assert "Model" in result.to_markdown()


def test_compare_refuses_test_logits_of_another_kind():
    logits, y = CASES["binary"][0]()
    multilabel = CASES["multilabel"][0]()
    with pytest.raises(ValueError, match="test"):
        peg.compare(logits, y, multilabel, progress=False, say=None)
