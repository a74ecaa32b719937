"""`peg.AutoSelect` on constructed problems whose right answer is known, its budgets, the data it
reads, save / load, the command line and bad input.

The bases are logits-level: the inputs are true logits z (labels drawn from softmax(z)) and the
model is a Linear layer that miscalibrates them in a known way (z·T: exactly temperature-
miscalibrated; z·diag(t): every class differently), so the candidates that can undo it are known.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable

import pytest
import torch
from sklearn.base import clone
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import peg
from bad_inputs import raises_test
from peg.apps.cli import main
from peg.apps.select import AutoSelect
from peg.apps.select.folds import stratified_folds
from peg.archive import read_header
from peg.errors import NotFittedError

SCALERS = ["TS", "Vector scaling", "Matrix scaling"]


def problem(n: int, classes: int, scale: list[float], seed: int = 0):
    """Inputs z `[n, C]` (true logits), labels drawn from softmax(z), and the model
    z → z·diag(scale)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, classes, generator=g) * 2.0
    y = torch.multinomial(z.softmax(-1), 1, generator=g)[:, 0]
    model = nn.Linear(classes, classes)
    with torch.no_grad():
        model.weight.copy_(torch.diag(torch.tensor(scale)))
        model.bias.zero_()
    return model.eval(), (z, y)


def test_an_exactly_temperature_miscalibrated_base_keeps_ts_by_one_se():
    model, val = problem(1500, 4, [3.0] * 4)
    sel = AutoSelect(candidates=SCALERS, cv=5, progress=False).fit(model, val)
    rows = {r["candidate"]: r for r in sel.report_}
    assert sel.chosen_ == "TS" and rows["TS"]["within_1se"]
    # the richer scalers are no better than TS beyond the noise (or raced out, worse)
    best = min((r for r in rows.values() if "cv_mean" in r), key=lambda r: r["cv_mean"])
    assert rows["TS"]["cv_mean"] - best["cv_mean"] <= rows["TS"]["diff_se"] + 1e-12
    assert sel.predictor_.temperature_ == pytest.approx(3.0, rel=0.15)
    assert sel.score_["mean"] == rows["TS"]["cv_mean"]


def test_classes_miscalibrated_differently_choose_vector_or_matrix_scaling():
    model, val = problem(2000, 4, [0.4, 1.0, 3.0, 6.0])
    sel = AutoSelect(candidates=SCALERS, cv=5, max_fit_seconds=None, progress=False)
    sel.fit(model, val)
    rows = {r["candidate"]: r for r in sel.report_}
    assert sel.chosen_ in ("Vector scaling", "Matrix scaling")
    assert not rows["TS"]["within_1se"]  # TS is worse by more than a paired SE


def test_150_points_matrix_scaling_by_default_is_no_worse_than_ts():
    """15 points per class: unregularised matrix scaling lost to TS by far (issue 39); its
    default, shrunk towards TS by cross-validation, stays within noise of TS or better."""
    model, val = problem(150, 10, [3.0] * 10)
    sel = AutoSelect(candidates=["TS", "Matrix scaling"], cv=3, one_se=False,
                     max_fit_seconds=None, progress=False)  # fmt: skip
    sel.fit(model, val)
    rows = {r["candidate"]: r for r in sel.report_}
    assert rows["Matrix scaling"]["cv_mean"] <= rows["TS"]["cv_mean"] + 0.02
    unregularised = peg.MatrixScaling(reg_lambda=0.0, reg_mu=0.0)
    X, y = val
    half = len(y) // 2
    raw = unregularised.fit(model, (X[:half], y[:half])).predict_proba(X[half:])
    ts = peg.TemperatureScaling().fit(model, (X[:half], y[:half])).predict_proba(X[half:])
    nll = lambda p: float(-p[torch.arange(len(p)), y[half:]].clamp_min(1e-12).log().mean())  # noqa: E731
    assert nll(raw) > nll(ts) + 0.02  # what the default avoids


def test_the_validation_logits_are_computed_once_for_the_calibrators():
    model, val = problem(400, 3, [2.0] * 3)
    seen: list[int] = []
    model.register_forward_hook(lambda m, i, o: seen.append(len(i[0])))
    AutoSelect(candidates=SCALERS, cv=4, progress=False).fit(model, val)
    assert [n for n in seen if n > 2] == [400]  # one pass; the cost probes read 2 rows


def test_the_budgets_drop_candidates_and_say_why():
    model, val = problem(1200, 3, [2.0] * 3)
    sel = AutoSelect(candidates=["TS", "PEG"], cv=2, max_forwards=2, progress=False)
    rows = {r["candidate"]: r for r in sel.fit(model, val).report_}
    assert rows["PEG"]["status"] == "dropped" and "max_forwards=2" in rows["PEG"]["why"]
    assert rows["PEG"]["forwards"] == pytest.approx(15) and sel.chosen_ == "TS"


def test_a_loader_is_read_by_index_and_gives_the_pairs_scores():
    model, (X, y) = problem(600, 3, [2.0] * 3)
    kw = {"candidates": ["TS", "PEG"], "cv": 2, "progress": False, "max_fit_seconds": None}
    pair = AutoSelect(**kw).fit(model, (X, y))
    loader = AutoSelect(**kw).fit(model, DataLoader(TensorDataset(X, y), batch_size=64))
    for a, b in zip(pair.report_, loader.report_, strict=True):
        assert a["cv_mean"] == pytest.approx(b["cv_mean"], rel=1e-5), a["candidate"]


def test_nested_cv_gives_the_honest_estimate():
    model, val = problem(600, 3, [3.0] * 3)
    sel = AutoSelect(candidates=["TS", "Vector scaling"], cv=3, nested=True, progress=False)
    sel.fit(model, val)
    assert len(sel.nested_["chosen"]) == 3 and sel.nested_["se"] > 0
    assert "nested CV" in sel.to_markdown()


def test_a_candidate_indistinguishable_from_its_base_gives_nothing_over_it(capsys):
    """A scale that leaves the members on the base (η = σ = 1e-9) is measured on the held-out
    outputs and left out of the choice unless better beyond noise than the others; its row
    says why. With `one_se=False`, the best mean alone took TS → PEG (here 6e-10 below TS)."""
    from peg.apps.compare import collapse, method

    tiny_pep = method("PEP-3 (σ=1e-9)", "pep", n_members=3, sigma=1e-9)
    tiny_chain = method("TS → PEG-3 (η=1e-9)", "peg", on="TS", n_members=3, eta=1e-9)
    model, val = problem(600, 3, [3.0] * 3)
    sel = AutoSelect(candidates=[tiny_pep, "TS", tiny_chain], cv=3, one_se=False,
                     max_fit_seconds=None).fit(model, val)  # fmt: skip
    said = capsys.readouterr().err  # a log: a line per candidate and fold
    assert "AutoSelect [fold 3/3] PEP-3 (σ=1e-9): " in said
    assert "indistinguishable from its base (model)" in said
    rows = {r["candidate"]: r for r in sel.report_}
    assert sel.chosen_ == "TS" and rows["TS"]["vs_base"] is None
    for name, base in (("PEP-3 (σ=1e-9)", "model"), ("TS → PEG-3 (η=1e-9)", "TS")):
        assert rows[name]["vs_base"] < collapse.INDISTINGUISHABLE and rows[name]["forwards"] == 3
        assert rows[name]["why"].startswith(f"indistinguishable from its base ({base})")
        assert "left out of the choice: not better than TS beyond noise" in rows[name]["why"]
    assert rows["TS → PEG-3 (η=1e-9)"]["cv_mean"] == pytest.approx(rows["TS"]["cv_mean"])
    assert "left out of the choice" in sel.to_markdown()
    # a well-calibrated model: the collapsed PEP (the model's predictions) beats TS beyond
    # noise and stays in the choice, said; with "Model" listed, the model itself is taken
    model, val = problem(600, 3, [1.0] * 3)
    sel = AutoSelect(candidates=[tiny_pep, "TS"], cv=3, progress=False).fit(model, val)
    rows = {r["candidate"]: r for r in sel.report_}
    assert sel.chosen_ == "PEP-3 (σ=1e-9)" and rows["TS"]["diff"] > rows["TS"]["diff_se"]
    assert 'the model as it is ("Model" as a candidate) gives the same' in rows[sel.chosen_]["why"]
    sel = AutoSelect(candidates=[tiny_pep, "Model", "TS"], cv=3, progress=False).fit(model, val)
    assert sel.chosen_ == "Model"


def test_save_and_load_give_the_chosen_predictor_back(tmp_path):
    model, val = problem(500, 3, [3.0] * 3)
    sel = AutoSelect(candidates=SCALERS, cv=3, progress=False).fit(model, val)
    path = sel.save(tmp_path / "chosen.peg")
    loaded = peg.load(path, nn.Linear(3, 3))
    X = val[0][:50]
    assert torch.allclose(loaded.predict_proba(X), sel.predict_proba(X), atol=1e-6)
    assert read_header(path)["meta"]["auto_select"]["chosen"] == sel.chosen_


def test_save_writes_the_archive_once_and_refuses_a_format_without_the_report(
    tmp_path, monkeypatch
):
    from peg import archive
    from peg.utils.io import save_tree

    model, val = problem(300, 3, [3.0] * 3)
    sel = AutoSelect(candidates=SCALERS, cv=3, progress=False).fit(model, val)
    writes: list[object] = []
    write = archive.atomic_save_file
    monkeypatch.setattr(archive, "atomic_save_file", lambda *a: writes.append(a) or write(*a))
    monkeypatch.setattr(archive, "read_tensors", None)  # nothing read back
    path = sel.save(tmp_path / "chosen.peg")
    assert len(writes) == 1 and read_header(path)["meta"]["auto_select"]["chosen"] == sel.chosen_
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chosen.peg"]  # no temporary left
    before = (tmp_path / "chosen.peg").read_bytes()
    # a save in a format of its own (as Laplace's) cannot carry the report: refused, path kept
    monkeypatch.setattr(sel.predictor_, "save", lambda p: save_tree(p, {"w": torch.ones(1)}))
    with pytest.raises(TypeError, match="format of its own"):
        sel.save(path)
    assert (tmp_path / "chosen.peg").read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chosen.peg"]


def test_the_method_contract():
    sel = AutoSelect(candidates=["TS"], cv=3)
    assert clone(sel).get_params() == sel.get_params() and "cv=3" in repr(sel)
    with pytest.raises(NotFittedError):
        sel.predict_proba(torch.zeros(2, 3))
    with pytest.raises(NotFittedError):
        _ = sel.chosen_
    model, val = problem(90, 3, [2.0] * 3)
    assert sel.fit(model, val) is sel and len(sel) == 1
    assert sel.member_logits(val[0]).shape == (1, 90, 3)
    assert peg.AutoSelect is AutoSelect


def test_peg_select_prints_the_report_and_saves(tmp_path, monkeypatch, capsys):
    model, (X, y) = problem(300, 3, [3.0] * 3)
    torch.save({"x": X, "y": y}, tmp_path / "val.pt")
    torch.save(model.state_dict(), tmp_path / "w.pt")
    (tmp_path / "selmodel.py").write_text(
        "import torch\nfrom torch import nn\ndef build():\n    m = nn.Linear(3, 3)\n"
        "    m.load_state_dict(torch.load('w.pt', weights_only=True))\n    return m\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "selmodel", raising=False)
    argv = ["select", "--model", "selmodel:build", "--val", "val.pt", "--candidates", "TS",
            "Vector scaling", "--cv", "3", "--save", "out", "--no-progress",
            "--max-fit-seconds", "none"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "| TS |" in out and out.rstrip().splitlines()[-1].startswith("chosen: TS")  # the answer
    md = (tmp_path / "out" / "results.md").read_text()
    assert "no budget (max_fit_seconds=None)" in md  # the cost line, whole in the report file
    written = json.loads((tmp_path / "out" / "results.json").read_text())
    assert written["cost"]["budget_seconds"] is None and written["cost"]["seconds"] > 0
    assert (
        written["chosen"] in ("TS", "Vector scaling")
        and (tmp_path / "out" / "chosen.peg").is_file()
    )


def _fit(candidates=("TS",), n=200, classes=3, **kw) -> Callable[[], object]:
    def call() -> object:
        model, val = problem(n, classes, [2.0] * classes)
        return AutoSelect(candidates=list(candidates), progress=False, **kw).fit(model, val)

    return call


def test_a_class_with_fewer_points_than_folds_is_warned_of_and_the_run_goes_on():
    """1,000 classes and 5,000 points leave some classes with fewer points than folds: the
    folds deal them into fewer folds (a warning says how many), every point is held out once."""
    model, (X, y) = problem(60, 3, [2.0] * 3)
    y = y.clone()
    y[y == 2] = 0
    y[0] = 2  # class 2: one point; a 2-fold split leaves it out of one fold's training part
    with pytest.warns(UserWarning, match=r"cv: 1 of 3 classes have fewer than 2 validation "
                      r"points \(class 2: 1\)"):  # fmt: skip
        fitted = AutoSelect(candidates=["TS", "Vector scaling"], cv=2, progress=False).fit(
            model, (X, y)
        )
    assert fitted.predict_proba(X).shape == (60, 3)
    folds = stratified_folds(y, 2, 0)
    assert sorted(torch.cat(folds).tolist()) == list(range(60))
    assert all(set(y[f].tolist()) >= {0, 1} for f in folds)  # the classes with enough points


ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    ("select", "unknown candidate", lambda: AutoSelect(candidates=["TS", "Platt"]),
     ValueError, r"candidates\[1\]: unknown method 'Platt'"),
    ("select", "candidates not a list", lambda: AutoSelect(candidates="TS"),
     TypeError, r"candidates: expected a list"),
    ("select", "cv below 2", lambda: AutoSelect(cv=1), ValueError, r"cv"),
    ("select", "unknown criterion", lambda: AutoSelect(criterion="ece"),
     ValueError, r"criterion: expected one of \['nll', 'brier'\]"),
    ("select", "a forwards budget that excludes everything", _fit(("TS",), max_forwards=0.5),
     ValueError, r"max_forwards=0.5: every candidate is over the budget; the cheapest, TS, "
     r"costs 1 forwards per input"),
    ("select", "a time budget that is not positive", lambda: AutoSelect(max_fit_seconds=0),
     ValueError, r"max_fit_seconds: expected a finite number > 0, got 0"),
    ("select", "a time budget neither seconds nor 'auto'",
     lambda: AutoSelect(max_fit_seconds="fast"),
     ValueError, r"max_fit_seconds: expected seconds > 0, 'auto' or None, got 'fast'"),
    ("select", "a race bound that is not positive", lambda: AutoSelect(race=-1.0),
     ValueError, r"race: expected a finite number > 0, got -1.0"),
    ("select", "model not a module",
     lambda: AutoSelect(candidates=["TS"]).fit("model", problem(20, 2, [1.0, 1.0])[1]),
     TypeError, r"model: expected a trained nn.Module"),
    # issue 46, item 5: cv=2**31 grew to 23 GB (a list per fold) before the OOM killer, 10**6
    # ended in std::bad_alloc; 2 points, or 15 with cv=10, were cross-validated with a warning
    ("select", "cv = 2**31 folds", _fit(("TS",), n=60, cv=2**31), ValueError,
     r"cv: 2,147,483,648 folds of 60 validation points leave folds of fewer than 2 points; "
     r"give cv <= 30 or more validation data"),
    ("select", "cv = 10 folds of 15 points", lambda: _few(15, cv=10), ValueError,
     r"cv: 10 folds of 15 validation points leave folds of fewer than 2 points; give cv <= 7"),
    ("select", "2 validation points", lambda: _few(2, cv=2), ValueError,
     r"cv: 2 folds of 2 validation points .*cross-validation needs at least 4: give more of "
     r"them"),
    ("select", "nested folds of one point", lambda: _few(8, cv=3, nested=True), ValueError,
     r"cv: nested=True runs 3 inner folds on 5 of the 8 validation points, leaving folds of "
     r"fewer than 2 points"),
]  # fmt: skip


def _few(n: int, **options: object) -> object:
    """AutoSelect on `n` points of saved logits through a model that must not run."""
    _, (z, y) = problem(n, 2, [1.0, 1.0])
    return AutoSelect(candidates=["TS"], progress=False, **options).fit(_Refusing(), (z, y))


class _Refusing(nn.Module):
    """A model whose forward pass fails: the folds' sizes are checked before any."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise AssertionError("the model ran before cv was checked")


def test_folds_of_few_points_are_warned_of_and_the_run_goes_on():
    """5 folds of 30 points: 6 a fold, under 10: a warning naming cv and the counts."""
    model, val = problem(30, 2, [2.0, 2.0])
    with pytest.warns(UserWarning, match=r"cv: 5 folds of 30 validation points hold 6.0 each "
                      r"\(fewer than 10\)"):  # fmt: skip
        sel = AutoSelect(candidates=["TS"], cv=5, progress=False).fit(model, val)
    assert sel.chosen_ == "TS"


test_bad_input = raises_test(ERROR_CASES)


def test_autoselect_says_each_step_in_a_log(capsys):
    """Output that is not a terminal (a log) gets a line per candidate and fold, as compare
    prints a line per method; progress=False keeps it silent."""
    import peg

    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, 3, (90,), generator=g)
    logits = torch.randn(90, 3, generator=g) + 2 * torch.nn.functional.one_hot(y, 3)
    peg.AutoSelect(candidates=["TS", "Vector scaling"], cv=3).fit(torch.nn.Identity(), (logits, y))
    said = capsys.readouterr().err
    assert "AutoSelect [fold 1/3] TS:" in said and "AutoSelect [fold 3/3] Vector scaling:" in said
    for f in (1, 2, 3):  # a line per fold, with what is spent of the budget and the ETA
        assert re.search(rf"AutoSelect \[fold {f}/3\] done: [\d.]+ s of the [\d.]+ s budget; "
                         r"\d candidates kept, leader .*; ETA \d+ s", said)  # fmt: skip
    peg.AutoSelect(candidates=["TS"], cv=3, progress=False).fit(torch.nn.Identity(), (logits, y))
    assert "AutoSelect" not in capsys.readouterr().err


def test_the_command_line_takes_names_as_typed_and_names_its_options(tmp_path, capsys):
    """Any case and '->' for '→' (as `peg bench` takes chains); errors name `--candidates`."""
    import numpy as np

    from peg.apps.compare.methods import _spec

    assert _spec("ts -> peg", "x").name == "TS → PEG" and _spec("pEg + Ts", "x").name == "PEG + TS"
    g = np.random.default_rng(0)
    np.save(tmp_path / "l.npy", g.normal(size=(60, 3)).astype(np.float32))
    np.save(tmp_path / "y.npy", g.integers(0, 3, 60))
    with pytest.raises(SystemExit) as e:
        main(["select", "--logits", str(tmp_path / "l.npy"), "--labels", str(tmp_path / "y.npy"),
              "--candidates", "TS", "Platt"])  # fmt: skip
    assert e.value.code == 2
    assert "peg select: error: --candidates[1]: unknown method 'Platt'" in capsys.readouterr().err


def test_a_race_drops_a_clearly_worse_candidate_and_says_why():
    """The model as it is, three times over-confident, is worse than TS beyond 3 paired SE
    after two folds: raced out, its row giving the difference and its score on those folds;
    `max_fit_seconds=None` (the exhaustive run) fits every candidate on every fold."""
    model, val = problem(1500, 4, [3.0] * 4)
    sel = AutoSelect(candidates=["Model", "TS"], cv=5, progress=False).fit(model, val)
    rows = {r["candidate"]: r for r in sel.report_}
    assert sel.chosen_ == "TS" and rows["Model"]["status"] == "dropped"
    assert rows["Model"]["why"].startswith("raced out after fold 2: worse than TS by +")
    assert len(rows["Model"]["fold_seconds"]) == 2 and len(rows["TS"]["fold_seconds"]) == 5
    assert rows["Model"]["partial_points"] == 600  # the two folds it was scored on
    assert rows["Model"]["partial_mean"] > rows["TS"]["cv_mean"]
    text = sel.to_markdown()
    assert "raced out after fold 2" in text and "× a temperature scaling fit" in text
    assert sel.cost_["race"] == 3.0 and sel.cost_["budget_seconds"] >= 5.0
    full = AutoSelect(candidates=["Model", "TS"], cv=5, max_fit_seconds=None, progress=False)
    rows = {r["candidate"]: r for r in full.fit(model, val).report_}
    assert [len(r["fold_seconds"]) for r in rows.values()] == [5, 5]
    assert rows["Model"]["status"] == "kept" and full.chosen_ == "TS"
    assert full.cost_["budget_seconds"] is None and "no budget" in full.to_markdown()


def test_a_time_budget_starts_no_candidate_it_cannot_finish_and_says_why():
    """A budget spent by the validation pass: the first candidate (TS) still runs, the network
    candidates are not started, each saying why."""
    model, val = problem(600, 3, [3.0] * 3)
    sel = AutoSelect(candidates=["TS", "PEG", "PEG + TS"], cv=3, max_fit_seconds=1e-3,
                     progress=False).fit(model, val)  # fmt: skip
    rows = {r["candidate"]: r for r in sel.report_}
    assert sel.chosen_ == "TS" and rows["TS"]["status"] == "chosen"
    for name in ("PEG", "PEG + TS"):
        assert rows[name]["status"] == "dropped" and rows[name]["fold_seconds"] == []
        assert rows[name]["why"].startswith("not started: budget 0.001 s")
    assert sel.cost_["budget_seconds"] == 1e-3 and sel.cost_["seconds"] > 1e-3
    assert "budget 0.0 s (max_fit_seconds=0.001)" in sel.to_markdown()


def test_a_chained_calibrator_reuses_its_base_s_held_out_outputs(monkeypatch):
    """PEG + TS scores the held-out fold with PEG's member logits, scaled: the model reads
    the held-out points for PEG, not again for PEG + TS (its fit reads the training part)."""
    from peg.apps.select import cross

    model, val = problem(600, 3, [3.0] * 3)
    calls = []
    outputs = cross.CrossFit.outputs
    monkeypatch.setattr(cross.CrossFit, "outputs", lambda self, spec, p, idx: calls.append(
        spec.name) or outputs(self, spec, p, idx))  # fmt: skip
    sel = AutoSelect(candidates=["PEG + TS"], cv=2, max_fit_seconds=None, progress=False)
    rows = {r["candidate"]: r for r in sel.fit(model, val).report_}
    assert rows["PEG + TS"]["status"] in ("kept", "chosen") and "cv_mean" in rows["PEG + TS"]
    assert "PEG + TS" not in calls and calls.count("PEG") == 2  # PEG's, once a fold


class _Cross:
    """What `race.Plan` reads of a `CrossFit`: candidates, their seconds a fold and scores."""

    def __init__(self, seconds: dict[str, float], bases: dict[str, str], points) -> None:
        from peg.apps.bench.spec import MethodSpec

        self.order = [MethodSpec(name=n, method="peg", base=bases.get(n, "model"))
                      for n in seconds]  # fmt: skip
        self.steps = {n: [s] for n, s in seconds.items()}
        self.base_of = {n: bases.get(n, "model") for n in seconds}
        self.dropped: dict[str, str] = {}
        self.points, self.gaps = points, {}

    def cheap(self, name: str) -> bool:
        return name == "TS"


def test_the_budget_drops_the_candidate_that_saves_most_chained_ones_before_their_base():
    """Over budget after a fold: the leader and the first candidate stay; a base still needed
    by a kept chained candidate saves nothing, so the chain goes first, then its base."""
    from peg.apps.select.race import Plan

    n = 40
    points = {"TS": torch.full((n,), 0.5, dtype=torch.float64),
              "LL": torch.full((n,), 0.4, dtype=torch.float64),  # the leader
              "PEG": torch.full((n,), 0.6, dtype=torch.float64),
              "PEG + TS": torch.full((n,), 0.45, dtype=torch.float64)}  # fmt: skip
    seconds = {"TS": 0.1, "LL": 1.0, "PEG": 10.0, "PEG + TS": 2.0}
    cross = _Cross(seconds, {"PEG + TS": "PEG"}, points)
    folds = list(torch.arange(n).chunk(4))
    said: list[str] = []
    # 3 folds left: all would take 3 × 13.1 s; without the chain and PEG 3 × 1.1 s (+ refit)
    Plan(10.0, None, time.perf_counter(), said.append).after_fold(cross, folds, 0)
    assert set(cross.dropped) == {"PEG + TS", "PEG"}
    assert cross.dropped["PEG + TS"].startswith("over budget after fold 1: 3 more folds at 2 s")
    assert said and "ETA 5 s" in said[0] and "leader LL" in said[0]  # 3 × 1.1 + LL's refit
    cross = _Cross(seconds, {"PEG + TS": "PEG"}, points)
    Plan(100.0, None, time.perf_counter(), said.append).after_fold(cross, folds, 0)
    assert cross.dropped == {}  # within the budget: nothing dropped


def test_a_map_on_the_logits_is_admitted_by_the_dearest_map_so_far():
    """1,000 classes: matrix scaling's fold costs 20-40 TS fits; a map is started on the first
    fold only if it fits in the budget at the dearest map's seconds so far (the first always)."""
    from peg.apps.bench.spec import MethodSpec
    from peg.apps.select.race import Plan

    n = 40
    points = {k: torch.full((n,), 0.5, dtype=torch.float64) for k in ("TS", "OP", "Matrix")}
    cross = _Cross({"TS": 1.0, "OP": 4.0}, {}, points)
    cross.cheap = lambda name: True  # every candidate a map on the cached logits
    matrix = MethodSpec(name="Matrix", method="matrix-scaling", base="model")
    cross.order.append(matrix)
    plan = Plan(30.0, None, time.perf_counter(), print, classes=1000)  # none known cheap
    why = plan.admit(cross, matrix, 5)  # 4 × 5 s left for TS and OP, then 5 × 4 s: 40 s
    assert why is not None and why.startswith("not started: budget 30 s")
    assert plan.admit(cross, cross.order[0], 5) is None  # the first candidate always starts
    assert (
        Plan(100.0, None, time.perf_counter(), print, classes=1000).admit(cross, matrix, 5) is None
    )


def test_cheap_candidates_go_first_and_a_chained_one_after_its_base():
    from peg.apps.bench.spec import MethodSpec
    from peg.apps.select.race import cheap_first

    specs = [MethodSpec(name="TS → PEG", method="peg", base="PEP"),  # ranked before PEP
             MethodSpec(name="PEP", method="pep", base="model"),
             MethodSpec(name="PEG", method="peg", base="model"),
             MethodSpec(name="Dirichlet", method="dirichlet", base="model")]  # fmt: skip
    order = [s.name for s in cheap_first(specs, lambda s: s.method == "dirichlet")]
    assert order == ["Dirichlet", "PEG", "PEP", "TS → PEG"]
