"""`peg.compare` and `peg compare`: the methods chosen, the table, its values, the CLI."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import numpy as np
import pytest
import torch
from torch import nn

import peg
from peg.apps import registry
from peg.apps.cli import main
from peg.apps.compare import CATALOGUE, Comparison, compare, method
from peg.apps.compare.diagrams import figure_name
from peg.apps.compare.methods import Scaled

from conftest import moons, overfit

COSTS = ("fit_seconds", "forwards", "memory_mb", "predict_seconds", "chosen")
METRICS = (
    "nll", "error", "brier", "ece", "mce", "adaptive_ece", "classwise_ece", "aurc", "augrc"
)  # fmt: skip
OOD = ("auroc", "aupr", "aupr_in", "fpr95")


def dropout_mlp(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, 20), nn.ReLU(), nn.Dropout(0.2), nn.Linear(20, 2))


@pytest.fixture(scope="module")
def data():
    return {"train": moons(200, 0), "val": moons(400, 1), "test": moons(300, 2)}


@pytest.fixture(scope="module")
def model(data):
    return overfit(dropout_mlp(), *data["train"], steps=300)


@pytest.fixture(scope="module")
def result(model, data) -> Comparison:
    X, y = data["test"]
    noisy = (X + 0.3 * torch.randn(X.shape, generator=torch.Generator().manual_seed(0)), y)
    far = torch.randn(100, 2, generator=torch.Generator().manual_seed(1)) * 5
    return compare(
        model, data["val"], data["test"], shifted={"noisy": noisy}, ood={"far": far}, say=None
    )


def test_the_default_methods_with_dropout(result):
    names = ["Model", "TS", "PEP", "PEG", "PEG + TS", "MC dropout", "Last-layer PEG"]
    assert [r["method"] for r in result.table] == names
    assert list(result.predictors) == names and result.skipped == {}


def test_mc_dropout_is_left_out_of_the_defaults_without_dropout(overfit_mlp, moons_data):
    done = compare(overfit_mlp, moons_data["val"], moons_data["test"], ["TS"], say=None)
    assert [r["method"] for r in done.table] == ["TS"]
    lines: list[str] = []
    defaults = compare(overfit_mlp, moons_data["val"], moons_data["test"], say=lines.append)
    assert "MC dropout" not in defaults.predictors
    assert "dropout" in defaults.skipped["MC dropout"]
    assert len(lines) == len(defaults.table) and lines[0].startswith("compare [1/6] Model")


def test_progress_false_is_quiet(overfit_mlp, moons_data, tmp_path, capsys):
    """No progress bar and no line (the default `say` prints, unless progress=False); a `say`
    given is still told."""
    val, test = moons_data["val"], moons_data["test"]
    compare(overfit_mlp, val, test, ["Model", "TS"], progress=False, out=tmp_path / "quiet")
    assert capsys.readouterr() == ("", "")
    lines: list[str] = []
    compare(overfit_mlp, val, test, ["TS"], progress=False, say=lines.append)
    assert len(lines) == 1 and capsys.readouterr() == ("", "")
    compare(overfit_mlp, val, test, ["TS"])  # the default: one line per method
    assert capsys.readouterr().out.startswith("compare [1/1] TS")


def test_every_column_and_the_values_of_peg_evaluate(result, data):
    for row in result.table:
        assert set(COSTS + METRICS) <= set(row)
        assert {f"{k} (noisy)" for k in METRICS} | {f"{k} (far)" for k in OOD} <= set(row)
        expected = peg.evaluate(result.predictors[row["method"]], *data["test"])
        for k in ("nll", "error", "brier", "ece"):
            assert row[k] == pytest.approx(expected[k], rel=1e-5, abs=1e-7), (row["method"], k)
        ranked = peg.evaluate(result.predictors[row["method"]], *data["test"], metrics=METRICS)
        for k in ("adaptive_ece", "classwise_ece", "aurc", "augrc"):
            assert row[k] == pytest.approx(ranked[k], rel=1e-5, abs=1e-7), (row["method"], k)
    assert result.sets == {
        "test": {"points": 300, "kind": "test"},
        "noisy": {"points": 300, "kind": "shifted"},
        "far": {"points": 100, "kind": "ood"},
    }


def test_peg_plus_ts_is_temperature_scaling_of_the_peg_ensemble(result):
    ts = result.predictors["PEG + TS"]
    assert isinstance(ts, peg.TemperatureScaling)
    assert ts.predictor_ is result.predictors["PEG"]
    assert result.row("PEG + TS")["chosen"].startswith("T = ")
    peg_row, both = result.row("PEG"), result.row("PEG + TS")
    assert both["fit_seconds"] >= peg_row["fit_seconds"]  # its base's fit included


def test_costs(result, model):
    rows = {r["method"]: r for r in result.table}
    assert rows["Model"]["forwards"] == 1 and rows["TS"]["forwards"] == 1
    assert rows["PEG"]["forwards"] == rows["MC dropout"]["forwards"] == 15
    assert 1 < rows["Last-layer PEG"]["forwards"] < 15  # the trunk runs once
    size = sum(t.numel() * t.element_size() for t in model.state_dict().values()) / 1e6
    assert rows["Model"]["memory_mb"] == rows["TS"]["memory_mb"] == pytest.approx(size)
    assert rows["PEG"]["memory_mb"] == pytest.approx(15 * size)


def test_markdown_and_the_results_folder(result, tmp_path):
    text = result.to_markdown()
    assert "| PEG + TS |" in text and "noisy (shifted, 300 points)" in text and "AUROC %" in text
    assert text.startswith(f"**{result.verdict().text()}**")  # the answer first
    header = next(line for line in text.splitlines() if line.startswith("| method |"))
    assert all(f" {label} |" in header for label in ("aECE %", "cwECE %", "AURC %", "AUGRC %"))
    shown = dataclasses.replace(result, metrics=("nll", "aurc")).to_markdown().splitlines()
    chosen = next(line for line in shown if line.startswith("| method |"))
    assert " NLL | AURC % | Fitted scale |" in chosen and "ECE" not in chosen
    json_path, md_path = result.write(tmp_path, "peg compare --test")
    written = json.loads(json_path.read_text())
    assert written["command"] == "peg compare --test" and len(written["table"]) == 7
    assert md_path.read_text().startswith("Command: `peg compare --test`")
    assert sorted(p.name for p in tmp_path.glob("*.png")) == [
        "reliability-noisy.png",
        "reliability-test.png",
    ]


def test_each_set_has_a_figure_file_of_its_own(overfit_mlp, moons_data, tmp_path):
    """Set names that one file name would serve (`a/b` and `a_b`; `A` and `a` on a disk that
    ignores case) get a figure each: none is overwritten."""
    names = ["a/b", "a_b", "A", "a"]
    assert len({figure_name(n).lower() for n in [*names, "test", "val"]}) == 6
    assert figure_name("noisy") == "reliability-noisy.png"  # a plain name as it is
    long = figure_name("x" * 1000)
    assert long.startswith("reliability-xxx") and len(long) < 100
    val, (X, y) = moons_data["val"], moons_data["test"]
    shifted = {n: (X[10 * i :], y[10 * i :]) for i, n in enumerate(names)}
    result = compare(overfit_mlp, val, (X, y), ["TS"], shifted=shifted, out=tmp_path, say=None)
    written = json.loads((tmp_path / "results.json").read_text())["figures"]
    assert len(set(written)) == len(result.figures) == 5 == len(list(tmp_path.glob("*.png")))


def test_methods_built_from_names_and_options(overfit_mlp, moons_data):
    methods = [
        method("PEG-3 (ascent)", "peg", n_members=3, direction="ascent"),
        "TS → PEG",  # its base TS is fitted first, and shown
        {"name": "PEP-2", "method": "pep", "n_members": 2},
    ]
    done = compare(overfit_mlp, moons_data["val"], moons_data["test"], methods, say=None)
    assert [r["method"] for r in done.table] == ["PEG-3 (ascent)", "TS", "TS → PEG", "PEP-2"]
    ascent, after_ts = done.predictors["PEG-3 (ascent)"], done.predictors["TS → PEG"]
    assert ascent.direction == "ascent" and len(ascent) == 3
    assert isinstance(after_ts.ensemble_.skeleton, Scaled)
    assert after_ts.ensemble_.skeleton.temperature == done.predictors["TS"].temperature_
    assert CATALOGUE["PEG (ascent)"].options == {"direction": "ascent"}


def test_an_ensemble_indistinguishable_from_its_base_is_noted(overfit_mlp, moons_data, monkeypatch):
    """A scale that leaves the members on the base (PEP at σ = 1e-9; PEG at η = 1e-9 around the
    temperature-scaled model) is a note on the row, measured on the outputs already held: with
    "Model" listed, one test pass per method; without it, the model's once more."""
    from peg.apps.compare import collapse, run

    methods = [
        method("PEP-3 (σ=1e-9)", "pep", n_members=3, sigma=1e-9),
        method("PEG-3", "peg", n_members=3),
        method("PEG-3 + TS", "temperature", on="PEG-3"),
        "TS",
        method("TS → PEG-3 (η=1e-9)", "peg", on="TS", n_members=3, eta=1e-9),
    ]
    passes = []
    counted = run.distributed.labelled_member_logits
    monkeypatch.setattr(run.distributed, "labelled_member_logits",
                        lambda *a, **k: passes.append(a[0]) or counted(*a, **k))  # fmt: skip
    lines: list[str] = []
    val, test = moons_data["val"], moons_data["test"]
    done = compare(overfit_mlp, val, test, ["Model", *methods], say=lines.append)
    assert len(passes) == 6  # one test pass per method: the bases' outputs were at hand
    rows = {r["method"]: r for r in done.table}
    assert rows["Model"]["vs_base"] is None and rows["TS"]["vs_base"] is None
    assert rows["PEG-3 + TS"]["vs_base"] is None  # no more members than PEG-3, its base
    assert rows["PEG-3"]["vs_base"] > 100 * collapse.INDISTINGUISHABLE
    assert "note" not in rows["PEG-3"]
    for name, base in (("PEP-3 (σ=1e-9)", "model"), ("TS → PEG-3 (η=1e-9)", "TS")):
        assert rows[name]["vs_base"] < collapse.INDISTINGUISHABLE
        assert rows[name]["note"].startswith(f"indistinguishable from its base ({base})")
        assert any(name in line and "indistinguishable" in line for line in lines)
    assert rows["PEP-3 (σ=1e-9)"]["nll"] == pytest.approx(rows["Model"]["nll"], abs=1e-6)
    assert "Notes: PEP-3 (σ=1e-9): indistinguishable" in done.to_markdown()
    passes.clear()
    alone = compare(overfit_mlp, val, test, methods[:1], say=None)  # no "Model" row
    assert passes == [alone.predictors["PEP-3 (σ=1e-9)"], overfit_mlp]  # the model's pass, once
    assert alone.table[0]["vs_base"] == pytest.approx(rows["PEP-3 (σ=1e-9)"]["vs_base"], rel=1e-3)


def test_laplace_by_name_on_the_validation_data(overfit_mlp, moons_data):
    pytest.importorskip("laplace")
    done = compare(overfit_mlp, moons_data["val"], moons_data["test"], ["Model", "Laplace"])
    fitted, row = done.predictors["Laplace"], done.row("Laplace")
    assert isinstance(fitted, peg.Laplace) and fitted.meta_["data_points"] == 600
    assert row["chosen"] == f"prior_precision = {fitted.prior_precision_:.3g}"
    assert row["memory_mb"] > done.row("Model")["memory_mb"]  # the posterior's factors too


def test_scaled_softmax_is_temperature_scaling(overfit_mlp, moons_data):
    ts = peg.TemperatureScaling().fit(overfit_mlp, moons_data["val"])
    X = moons_data["test"][0]
    got = Scaled(overfit_mlp, ts.temperature_)(X).softmax(-1)
    torch.testing.assert_close(got, ts.predict_proba(X), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"methods": ["PEG-15"]}, ValueError, r"methods\[0\]: unknown method 'PEG-15'"),
        ({"methods": [method("P", "peg", eta=-1)]}, ValueError, r"methods\[0\] \(P\): eta"),
        ({"methods": ["MC dropout"]}, ValueError, "no dropout layer"),
        ({"methods": ["TS", "TS"]}, ValueError, "listed twice"),
        ({"methods": [method("X", "peg", on="Nope")]}, ValueError, "on='Nope' is neither"),
        ({"methods": [method("P", "packed")]}, ValueError, "not a post-hoc method"),
        ({"methods": "PEG"}, TypeError, "methods: expected a list"),
        ({"val": torch.zeros(3, 2)}, TypeError, "val: expected labelled data"),
        ({"test": (torch.zeros(3, 2), torch.ones(3) / 2)}, ValueError, "test: expected integer"),
        ({"ood": {"test": torch.zeros(3, 2)}}, ValueError, "ood: names"),
        ({"ood": [1, 2]}, TypeError, r"ood\['ood'\]: expected inputs"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"ood_score": "nope"}, ValueError, "ood_score"),
        ({"metrics": ["nll", "auroc"]}, ValueError, "metrics: expected a list of keys among"),
        ({"model": "model.pt"}, TypeError, "model: expected a trained nn.Module"),
    ],
)
def test_bad_inputs_are_refused_before_anything_is_fitted(
    overfit_mlp, moons_data, monkeypatch, kwargs, error, match
):
    monkeypatch.setattr(registry, "build", lambda *a, **k: pytest.fail("fitted"))
    args = {"model": overfit_mlp, "val": moons_data["val"], "test": moons_data["test"]} | kwargs
    with pytest.raises(error, match=match):
        compare(args.pop("model"), args.pop("val"), args.pop("test"), say=None, **args)


def test_peg_compare_is_the_application_imported_on_first_use():
    import peg.apps.compare

    assert peg.compare is peg.apps.compare.compare and "compare" in dir(peg)


# ---------------------------------------------------------------- the command line
MODULE = """
import torch
from torch import nn

def build():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 20), nn.ReLU(), nn.Dropout(0.2), nn.Linear(20, 2))
    net.load_state_dict(torch.load("weights.pt", weights_only=True))
    return net.eval()

def test_data():
    from torch.utils.data import TensorDataset
    d = torch.load("test.pt", weights_only=True)
    return TensorDataset(d["x"], d["y"])
"""


@pytest.fixture()
def user_folder(tmp_path, monkeypatch, model, data):
    """A folder as a user has it: their module, weights, .npz and .pt data; the current
    directory, not on sys.path (the CLI puts it there)."""
    (tmp_path / "usermodel_cmp.py").write_text(MODULE)
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    X, y = data["val"]
    np.savez(tmp_path / "val.npz", x=X.numpy(), y=y.numpy())
    torch.save({"x": data["test"][0], "y": data["test"][1]}, tmp_path / "test.pt")
    np.savez(tmp_path / "far.npz", X=np.random.default_rng(0).normal(size=(50, 2)) * 5)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "usermodel_cmp", raising=False)
    return tmp_path


def test_the_command_line_end_to_end(user_folder, capsys):
    status = main(
        ["compare", "--model", "usermodel_cmp:build", "--val", "val.npz", "--test", "test.pt",
         "--shifted", "again=usermodel_cmp:test_data", "--ood", "far.npz",
         "--methods", "TS", "PEG + TS", "MC dropout", "--out", "out", "--no-progress"]
    )  # fmt: skip
    assert status == 0
    written = json.loads((user_folder / "out" / "results.json").read_text())
    assert [r["method"] for r in written["table"]] == ["TS", "PEG", "PEG + TS", "MC dropout"]
    assert written["command"].startswith("peg compare --model usermodel_cmp:build")
    row = written["table"][0]
    assert row["nll (again)"] == pytest.approx(row["nll"]) and "auroc (far)" in row
    assert "| PEG + TS |" in capsys.readouterr().out
    assert (user_folder / "out" / "reliability-again.png").is_file()


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--model", "nowhere_cmp:build"], "--model: cannot import 'nowhere_cmp'"),
        (["--model", "usermodel_cmp:missing"], "has no function 'missing'"),
        (["--model", "usermodel_cmp:test_data"], "not an nn.Module"),
        (["--val", "missing.npz"], "--val: no file at missing.npz"),
        (["--val", "far.npz"], "no labels 'y'"),
        (["--val", "nothing"], "neither a data set"),
        (["--test", "two-moons:valid"], "unknown split 'valid'"),
        (["--methods", "PEG-15"], "unknown method 'PEG-15'"),
        (["--metrics", "nll", "AURC"], "metrics: expected a list of keys among"),
    ],
)
def test_the_command_line_refuses_bad_specs(user_folder, capsys, args, match):
    base = {"--model": "usermodel_cmp:build", "--val": "val.npz", "--test": "test.pt"}
    argv = ["compare"] + [a for k, v in base.items() if k not in args for a in (k, v)] + args
    with pytest.raises(SystemExit) as stopped:
        main([*argv, "--out", "out"])
    assert stopped.value.code == 2 and match in capsys.readouterr().err
    assert not (user_folder / "out").exists()


def test_a_pt_file_of_pickled_objects_is_refused(user_folder, capsys):
    torch.save({"x": torch.zeros(2, 2), "y": object()}, user_folder / "bad.pt")
    with pytest.raises(SystemExit):
        main(["compare", "--model", "usermodel_cmp:build", "--val", "bad.pt", "--test", "test.pt"])
    assert "not a file of tensors" in capsys.readouterr().err


def test_one_registry_split_for_val_and_test_is_halved(capsys):
    from peg.apps.compare import sources

    val, test = sources.val_and_test("two-moons", "two-moons:test", 0, print)
    assert len(val[0]) == len(test[0]) == 500 and "half of it each" in capsys.readouterr().out


def test_a_pt_file_names_the_global_it_refused_or_says_it_is_no_torch_file(user_folder, capsys):
    """torch's "weights_only=False will likely succeed" was relayed and the blocked global
    hidden; a text file named .pt gave a raw KeyError."""
    torch.save({"x": torch.zeros(2, 2), "y": os.system}, user_folder / "bad.pt")
    (user_folder / "text.pt").write_text("hello world\n")
    for name, said in (("bad.pt", "holds a pickled posix.system"), ("text.pt", "KeyError")):
        with pytest.raises(SystemExit):
            main(["compare", "--model", "usermodel_cmp:build", "--val", name, "--test", "test.pt"])
        err = capsys.readouterr().err
        assert "not a file of tensors" in err and said in err and "weights_only=False" not in err
        assert "`weights_only` set to `False`" not in err
