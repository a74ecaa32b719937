"""The answer first (`peg.apps.verdict`): every report of `peg.compare` and `AutoSelect` opens
with the verdict (the choice, NLL and ECE before → after with their paired SEs, whether the
difference is real), AutoSelect has the uncalibrated baseline's row, bold marks only a real best,
a reason shared by several rows is said once; and the text forms peg writes are safe: names
escaped in every markdown form, formulas neutralised in every CSV."""

from __future__ import annotations

import csv
import io
import math
import re

import numpy as np
import pytest
import torch
from torch import nn

import peg
from peg.apps.compare import Comparison, compare
from peg.apps.compare.faults import NO_WEIGHTS
from peg.apps.select import AutoSelect
from peg.apps.select.report import to_table
from peg.apps.verdict import Verdict, best_beyond_noise, ece, ece_se, per_point


def _problem(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, generator=g)
    return X, (X[:, 0] + 0.5 * X[:, 1] > 0).long() + (X[:, 2] > 0.8).long()


def _overconfident() -> nn.Module:
    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[-4.0, -2, 0, 0], [4, 2, -6, 0], [0, 0, 9, 1]]))
        model.bias.zero_()
    return model.eval()


@pytest.fixture(scope="module")
def comparison() -> Comparison:
    return compare(
        _overconfident(),
        _problem(400, 1),
        _problem(400, 2),
        ["Model", "TS"],
        say=None,
        progress=False,
    )


@pytest.fixture(scope="module")
def selector() -> AutoSelect:
    X, y = _problem(450, 4)
    with torch.no_grad():
        logits = _overconfident()(X)
    candidates = ["TS", "Vector scaling", "PEG", "PEP"]  # the last two: no weights on logits
    return AutoSelect(candidates=candidates, cv=3, max_fit_seconds=None, progress=False).fit(
        nn.Identity(), (logits, y)
    )


# ---------------------------------------------------------------- the statistics
def test_the_paired_se_and_the_bootstrap_see_a_real_difference_and_a_tie() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(1, 2000, 3, generator=g) * 3
    y = torch.randint(0, 3, (2000,), generator=g)
    raw, tempered = per_point(logits, y), per_point(logits / 3, y)
    assert raw["nll"].mean() > tempered["nll"].mean()  # over-confident: tempering helps
    assert ece(raw["confidence"], raw["correct"]) == pytest.approx(
        peg.metrics.ece(logits[0].softmax(-1), y), abs=1e-6
    )
    assert 0 < ece_se(raw, tempered) < 0.05
    assert math.isnan(ece_se(raw, {k: v[:10] for k, v in raw.items()}))  # not the same points
    scores = {"raw": float(raw["nll"].mean()), "tempered": float(tempered["nll"].mean())}
    both = {"raw": raw, "tempered": tempered}
    assert best_beyond_noise(scores, both, "nll", higher=False) == "tempered"
    # a column of equal values, or a row equal to the best: no bold
    assert best_beyond_noise({"a": 1.0, "b": 1.0}, {"a": raw, "b": raw}, "nll", False) is None
    assert best_beyond_noise({"a": 1.0, "b": 2.0}, {"a": raw}, "nll", False) is None


def test_the_verdict_says_better_same_and_worse() -> None:
    better = Verdict(
        "TS", "nll", 0.603, 0.004, 400, "test points", "Model", 0.621, 0.045, 0.014, 0.005
    )
    assert better.text() == (
        "best: TS, NLL 0.621 → 0.603 (± 0.004 paired, 400 test points), ECE 4.5 → 1.4 % "
        "(± 0.5 paired bootstrap): a real improvement (beyond 2 SE)"
    )
    same = Verdict("TS", "nll", 0.619, 0.004, 400, "test points", "Model", 0.621)
    assert same.judgement() == "same" and "no real difference" in same.text()
    worse = Verdict("VS", "nll", 0.70, 0.01, 400, "test points", "Model", 0.621)
    assert worse.judgement() == "worse" and "WORSE than the uncalibrated model" in worse.text()
    # NLL within noise but ECE worse beyond it: worse, said so
    ece_worse = Verdict("VS", "nll", 0.62, 0.01, 400, "p", "Model", 0.621, 0.01, 0.05, 0.005)
    assert ece_worse.judgement() == "worse"
    alone = Verdict("TS", "nll", 0.603, 0.02, 400, "test points")
    assert "no uncalibrated row" in alone.text() and alone.judgement() == "unknown"


# ---------------------------------------------------------------- compare
def test_compare_opens_with_the_verdict(comparison) -> None:
    said = comparison.verdict()
    assert said is not None and said.choice == "TS" and said.baseline == "Model"
    assert (
        said.before == comparison.row("Model")["nll"] and said.after == comparison.row("TS")["nll"]
    )
    assert 0 < said.se < said.before - said.after  # paired on the same 400 points
    assert said.ece_se is not None and said.ece_se > 0
    text = comparison.to_markdown()
    assert text.startswith(f"**{said.text()}**") and "a real improvement" in said.text()
    html = comparison.to_html()
    body = html[html.index("<h1>") :]
    first = body.index('class="peg-verdict')
    assert first < body.index("<table") and first < body.index("Evaluated on")
    notebook = comparison._repr_html_()
    assert notebook.index("peg-verdict") < notebook.index("<table")
    assert comparison.to_pandas().attrs["verdict"] == said.text()


def test_compare_titles_marks_and_bold(comparison) -> None:
    assert "<title>compare</title>" in comparison.to_html() and "peg compare" not in (
        comparison._repr_html_()
    )
    assert 'href="reference/compare.html"' in comparison._repr_html_()  # the "?"
    header, _, model, ts = comparison.to_markdown().split("\n\n")[1].splitlines()[:4]
    assert "| choice |" in header and "Fitted scale" in header and "Chosen" not in header
    assert model.startswith("| Model | baseline |") and ts.startswith("| TS | best |")
    assert "T = " in ts
    cells = [c.strip() for c in model.split("|")[1:-1]]
    assert not any(c.startswith("**") for c in cells)  # the raw model's 0.00 s: never bold
    bold = [c.strip() for c in ts.split("|")[1:-1] if c.strip().startswith("**")]
    assert f"**{comparison.row('TS')['nll']:.4f}**" in bold  # a real best (beyond 2 paired SE)
    error = [c.strip() for c in ts.split("|")[1:-1]][header.split("|")[1:-1].index(" Error % ")]
    assert not error.startswith("**")  # TS keeps the model's error: a tie, not bold


def test_a_tie_of_every_row_is_never_bold() -> None:
    points = per_point(
        torch.randn(1, 50, 3, generator=torch.Generator().manual_seed(1)), torch.arange(50) % 3
    )
    table = [
        {
            "method": m,
            "base": "model",
            "nll": 0.5,
            "error": 0.1,
            "ece": 0.02,
            "fit_seconds": 0.0,
            "predict_seconds": 0.0,
        }
        for m in ("Model", "A", "B")
    ]
    result = Comparison(
        table, {}, {}, {}, {"test": {"points": 50, "kind": "test"}}, metrics=("nll", "error", "ece")
    )
    result.points = {"test": {m: points for m in ("Model", "A", "B")}}
    assert "**" not in result.to_markdown().split("\n\n", 1)[1]  # only the verdict is bold
    assert "no method beats" in result.verdict().text() or "no real difference" in (
        result.verdict().text()
    )


def test_compare_says_when_the_best_is_worse_than_the_model() -> None:
    g = torch.Generator().manual_seed(2)
    good = torch.randn(1, 500, 3, generator=g) * 2
    y = torch.multinomial(good[0].softmax(-1), 1, generator=g)[:, 0]  # calibrated
    worse = good * 5  # over-confident
    points = {"Model": per_point(good, y), "Bad": per_point(worse, y)}
    table = [
        {
            "method": m,
            "base": "model",
            "nll": float(p["nll"].double().mean()),
            "ece": ece(p["confidence"], p["correct"]),
        }
        for m, p in points.items()
    ]
    result = Comparison(
        table, {}, {}, {}, {"test": {"points": 500, "kind": "test"}}, metrics=("nll", "ece")
    )
    result.points = {"test": points}
    assert result.verdict().choice == "Bad"
    assert "WORSE than the uncalibrated model" in result.to_markdown().splitlines()[0]


def test_a_reason_shared_by_left_out_methods_is_said_once() -> None:
    X, y = _problem(300, 3)
    with torch.no_grad():
        logits = _overconfident()(X)
    result = compare(
        logits[:150],
        y[:150],
        (logits[150:], y[150:]),
        ["Model", "TS", "PEG", "PEP", "MC dropout"],
        say=None,
        progress=False,
    )
    assert len(result.skipped) >= 2
    assert result.to_markdown().count(NO_WEIGHTS) == 1
    assert result.to_html().count(NO_WEIGHTS) == 1


# ---------------------------------------------------------------- AutoSelect
def test_autoselect_opens_with_the_verdict_and_has_a_baseline(selector) -> None:
    said = selector.verdict_
    assert said.choice == selector.chosen_ and said.baseline == "Uncalibrated"
    assert said.before > said.after and "a real improvement" in said.text()
    assert selector.baseline_["status"] == "baseline"
    assert selector.baseline_["cv_mean"] == pytest.approx(said.before)
    text = selector.to_markdown()
    assert text.startswith(f"**{said.text()}**")
    assert "| Uncalibrated |" in text and "baseline" in text
    page = selector.to_html()
    assert "<title>AutoSelect</title>" in page and "peg select" not in page
    body = page[page.index("<h1>") :]
    assert body.index("peg-verdict") < body.index("Chosen:") < body.index("<table")
    notebook = selector._repr_html_()
    assert 'href="reference/AutoSelect.html"' in notebook and "peg select" not in notebook
    assert selector.meta_["verdict"]["text"] == said.text()


def test_autoselect_says_no_weights_once(selector) -> None:
    dropped = [r for r in selector.report_ if r["why"] == NO_WEIGHTS]
    assert len(dropped) == 2
    assert selector.to_markdown().count(NO_WEIGHTS) == 1
    shown = selector._repr_html_()
    assert shown[: shown.index("<summary>As text")].count(NO_WEIGHTS) == 1  # the rest: folded
    assert "dropped (note 1)" in selector.to_markdown()


def test_autoselect_to_pandas_is_flat(selector) -> None:
    pandas = pytest.importorskip("pandas")
    frame = selector.to_pandas()
    assert frame.index[0] == "Uncalibrated" and frame.loc["Uncalibrated", "status"] == ("baseline")
    for column in frame.columns:
        assert not any(isinstance(v, (list, tuple, dict)) for v in frame[column]), column
        assert not any(v is None for v in frame[column]), column  # NaN, one convention
    assert "method" not in frame.columns  # the registry's keys ("vector-scaling") left out
    assert not frame.isin(["vector-scaling", "temperature", "model"]).any().any()
    assert frame.loc["TS", "base"] == "Model" and frame.loc["TS", "folds"] == 3
    assert pandas.isna(frame.loc["Uncalibrated", "fit_seconds"])
    assert frame.attrs["verdict"] == selector.verdict_.text()


# ---------------------------------------------------------------- markdown and CSV safety
NAMES = ["a|b", "two\nlines", "back`tick", "*star*", "<b>x</b>", "=1+2", "[l](javascript:x)"]


def _rows_of(table: str) -> list[str]:
    return [line for line in table.splitlines() if line.startswith("|")]


def _same_columns(text: str) -> bool:
    """Every row of every table in `text` has its header's columns (an escaped `\\|` is not one)."""
    for block in text.split("\n\n"):
        rows = [r.replace("\\|", "") for r in _rows_of(block)]
        if any(r.count("|") != rows[0].count("|") for r in rows):
            return False
    return True


def test_every_markdown_form_escapes_names() -> None:
    """A name with `|`, a newline, backticks, `*` or `<` neither adds a row or a column nor
    becomes markup, in compare's, AutoSelect's, the monitor's and a method's markdown."""
    table = [{"method": n, "base": "model", "nll": 0.5} for n in NAMES]
    sets = {"test": {"points": 10, "kind": "test"}, "x|\ny": {"points": 10, "kind": "shifted"}}
    text = Comparison(table, {}, {}, {"p|q\nr": "why|\nnot"}, sets, metrics=("nll",)).to_markdown()
    rows = _rows_of(text)
    assert len(rows) == 2 * (2 + len(NAMES))  # two tables: header, rule, a row per method
    assert _same_columns(text)
    assert not re.search(r"(?<!\\)<", text) and "\n| lines" not in text and "*star*" not in text
    assert not re.search(r"(?<!\\)\[l\]", text)
    # AutoSelect's table
    report = [{"candidate": n, "status": "dropped", "why": n, "fold_seconds": []} for n in NAMES]
    text = to_table(report, "nll")
    assert len(_rows_of(text)) == 2 + len(NAMES) and _same_columns(text)
    # a method's display
    shown = peg.TemperatureScaling(max_iter=50)
    shown.__dict__["odd_"] = "a|b\n| c | d |"
    shown.__dict__["temperature_"] = 1.0
    text = shown._repr_markdown_()
    assert _same_columns(text) and "| c | d |" not in text


def test_the_monitor_markdown_escapes_a_source_name(tmp_path) -> None:
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 600)
    logits = rng.standard_normal((600, 3)).astype(np.float32)
    logits[np.arange(600), y] += 2.5
    estimator = peg.PerformanceEstimator(method="atc-mc").fit(logits[:400], y[:400])
    m = peg.Monitor(estimator, out=tmp_path / "m")
    m.update(logits[400:500], name="file\n| 9 | fake | row |")
    m.update(logits[500:], name='=HYPERLINK("http://x")')
    written = (tmp_path / "m" / "results.md").read_text(encoding="utf-8")
    assert len(_rows_of(written)) == 2 + 2 and _same_columns(written)
    assert "\n| 9 | fake" not in written
    cells = list(csv.reader(io.StringIO((tmp_path / "m" / "results.csv").read_text())))
    sources = [r[cells[0].index("source")] for r in cells[1:]]
    assert sources[1] == '\'=HYPERLINK("http://x")'  # neutralised: a spreadsheet shows text


def test_every_csv_neutralises_formulas_and_keeps_numbers(selector) -> None:
    table = [{"method": n, "base": "@b", "nll": -0.5, "note": "-2+3"} for n in ("=cmd", "+x", "ok")]
    result = Comparison(table, {}, {}, {}, {"test": {"points": 10, "kind": "test"}})
    rows = list(csv.DictReader(io.StringIO(result.to_text("csv"))))
    assert [r["method"] for r in rows] == ["'=cmd", "'+x", "ok"]
    assert rows[0]["base"] == "'@b" and rows[0]["nll"] == "-0.5" and rows[0]["note"] == "'-2+3"
    for text in ("\tx", "\rx", "-x", "@x"):
        assert peg.apps.html.csv_text(text) == "'" + text
    assert peg.apps.html.csv_text("x=1") == "x=1"
    out = selector.to_text("csv")  # AutoSelect's, through the same helper
    records = list(csv.DictReader(io.StringIO(out)))
    assert records[0]["candidate"] == "Uncalibrated" and float(records[0]["cv_mean"]) > 0


# ---------------------------------------------------------------- the estimator's display
def test_performance_estimator_and_estimate_show_themselves() -> None:
    rng = np.random.default_rng(1)
    y = rng.integers(0, 4, 600)
    logits = rng.standard_normal((600, 4)).astype(np.float32)
    logits[np.arange(600), y] += 2.0
    unfitted = peg.PerformanceEstimator(method="atc-mc")
    assert "not fitted" in unfitted._repr_html_()
    fitted = unfitted.fit(logits[:400], y[:400])
    html = fitted._repr_html_()
    assert "fitted" in html and "temperature_" in html
    assert 'href="reference/PerformanceEstimator.html"' in html
    estimate = fitted.estimate(logits[400:])
    said = repr(estimate)
    assert said.startswith("Estimate(accuracy=") and f"{estimate.accuracy:.4g}" in said
    assert str(estimate.accuracy) not in said or len(str(estimate.accuracy)) <= 6
    assert not any(len(n) > 8 for n in re.findall(r"\d\.\d+", said))
    assert "<table" in estimate._repr_html_() and "interval" in estimate._repr_markdown_()
    assert "reference/Estimate.html" in estimate._repr_html_()  # its own page


def test_the_verdict_line_escapes_the_name_it_states():
    """The verdict opens every HTML report and states a user's method name: no markup from it."""
    from peg.apps.html import verdict_html
    from peg.apps.verdict import Verdict

    name = '<script>alert(1)</script><b onmouseover="x">'
    said = Verdict(name, "nll", after=0.5, se=0.01, points=10, where="test", baseline="Model")
    said.before = 0.6
    html = str(verdict_html(said))
    assert "<script" not in html and "<b " not in html and "&lt;script&gt;" in html
