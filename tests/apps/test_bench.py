"""`peg bench`: spec validation, presets, results shape, cache and resume after interruption."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from peg.apps.bench import runner
from peg.apps.bench.runner import check_methods, fit_images
from peg.apps.bench.spec import SpecError, find_spec, load_specs, load_uci_spec, parse_spec
from peg.apps.cli import main
from peg.apps.scores import CLASSIFICATION

from conftest import run_bench

SMALL = {
    "name": "tiny-digits",
    "data": "digits",
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"epochs": 6, "lr": 0.05, "batch_size": 64},
    "swa": {
        "epochs": 6,
        "lr": 0.05,
        "batch_size": 64,
        "schedule": "swa",
        "swa_start": 3,
        "swa_lr": 0.01,
    },
    "seeds": [0],
    "score_points": None,
    "swag_samples": 4,
    "methods": ["Single", "Temp-scaled", "SWA", "DeepEns-2", "PEG-4", "PEG-4 (DeepEns-2)"],
    "shift": {"rotations": [30], "corruptions": ["contrast"], "severities": [3]},
    "ood": ["mnist"],
}



@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    spec = parse_spec(SMALL)
    results = run_bench(spec, out)
    return out, spec, results


def test_results_have_the_documented_shape(tiny_run):
    out, spec, _ = tiny_run
    saved = json.loads((out / "tiny-digits" / "results.json").read_text())
    assert {"command", "commit", "machine", "datasets"} <= saved.keys()
    assert set(saved["datasets"]) == {"test", "rotate-30", "contrast-3", "mnist (OOD)"}
    for dataset, methods in saved["datasets"].items():
        assert list(methods) == [m.name for m in spec.methods]
        expected = (
            {"auroc", "aupr", "aupr_in", "fpr95"} if "OOD" in dataset else set(CLASSIFICATION)
        )  # every metric, whatever rows the tables show
        for cell in methods.values():
            assert set(cell) == expected
            assert all(set(v) == {"mean", "std", "n"} and v["n"] == 1 for v in cell.values())
    assert saved["ood"]["positive"] == "ood"
    text = (out / "tiny-digits" / "results.md").read_text()
    assert "## mnist (OOD)" in text and "| AUROC % |" in text and "| NLL |" in text
    for figure in ("reliability-test.png", "risk-coverage-test.png"):
        assert (out / "tiny-digits" / figure).read_bytes()[:4] == b"\x89PNG"
    test = saved["datasets"]["test"]
    assert test["Temp-scaled"]["error"]["mean"] == test["Single"]["error"]["mean"]
    assert test["Single"]["error"]["mean"] < 0.2


def test_a_cache_made_for_other_data_is_refused(tiny_run):
    out, _, _ = tiny_run
    other = parse_spec({**SMALL, "train_points": 300})
    with pytest.raises(SpecError, match=r"train_points=None; this spec has train_points=300"):
        run_bench(other, out)


def test_interrupted_after_the_first_method_resumes_to_identical_results(
    tiny_run, tmp_path, monkeypatch
):
    _, spec, reference = tiny_run
    built = []
    original = runner.SeedRun.build

    def build_once(self, method):
        if built:
            raise KeyboardInterrupt  # killed while building the second method
        built.append(method.name)
        return original(self, method)

    monkeypatch.setattr(runner.SeedRun, "build", build_once)
    with pytest.raises(KeyboardInterrupt):
        run_bench(spec, tmp_path)
    assert not (tmp_path / "tiny-digits" / "results.json").exists()  # nothing final written
    monkeypatch.undo()
    resumed = run_bench(spec, tmp_path)
    assert resumed["datasets"] == reference["datasets"]


def test_a_rerun_reads_every_logit_from_the_cache(tiny_run, monkeypatch):
    out, spec, reference = tiny_run

    def refuse(self, method):
        raise AssertionError("a cached method was rebuilt")

    monkeypatch.setattr(runner.SeedRun, "build", refuse)
    again = run_bench(spec, out)
    assert again["datasets"] == reference["datasets"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"methods": ["Single", "Bayes-by-backprop"]}, r"methods\[1\]"),
        ({"methods": [{"name": "x", "method": "peg", "base": "nowhere"}]}, r"methods\[0\]\.base"),
        ({"data": "imagenet"}, r"\.data"),
        ({"train": {"epochs": -3}}, r"\.train\.epochs"),
        ({"model": {"name": "transformer"}}, r"model\.name"),
        ({"shift": {"corruptions": ["hail"]}}, r"shift\.corruptions"),
        ({"ood": ["svhn-extra"]}, r"\.ood"),
        ({"seeds": []}, r"\.seeds"),
        ({"swa": None}, r"\.swa"),
        ({"colour": "red"}, "unknown field"),
        ({"methods": ["PEG-10 (DeepEns-3)"]}, "do not split"),
        ({"metrics": ["nll", "auroc"]}, r"\.metrics: unknown \['auroc'\]"),
        ({"metrics": ["nll", "nll"]}, r"\.metrics: expected distinct keys"),
        ({"metrics": "nll"}, r"\.metrics: expected a list"),
        ({"figures": ["Single", "PEG-9"]}, r"\.figures: .*unknown \['PEG-9'\]"),
        ({"figures": []}, r"\.figures: expected a non-empty list"),
    ],
)
def test_malformed_specs_name_the_field(change, field):
    with pytest.raises(SpecError, match=field):
        parse_spec({**SMALL, **change})


def test_missing_required_fields_are_named():
    raw = {k: v for k, v in SMALL.items() if k != "data"}
    with pytest.raises(SpecError, match=r"spec\.data: missing"):
        parse_spec(raw)


def test_bad_method_options_fail_before_training(tmp_path):
    spec = parse_spec({**SMALL, "methods": [{"name": "PEG-4", "eta": -1.0}]})
    with pytest.raises(ValueError, match=r"methods\[0\] \(PEG-4\).*eta"):
        run_bench(spec, tmp_path)
    assert not (tmp_path / "cache").exists()


def test_the_spec_s_metrics_choose_the_rows_of_the_labelled_tables(tiny_run):
    out, spec, results = tiny_run
    assert spec.metrics == ("nll", "error", "brier", "ece")  # the default rows
    text = (out / "tiny-digits" / "results.md").read_text()
    assert "| ECE % |" in text and "AURC" not in text
    chosen = parse_spec({**SMALL, "metrics": ["aurc", "nll", "classwise_ece", "augrc"]})
    text = runner.report(results, chosen)  # the same results, other rows: no model is run
    test_table = text.split("## test")[1].split("##")[0]
    rows = [line.split("|")[1].strip() for line in test_table.splitlines() if line[:2] == "| "]
    assert rows == ["metric", "AURC %", "NLL", "cwECE %", "AUGRC %"]
    aurc = results["datasets"]["test"]["Single"]["aurc"]["mean"]
    assert f"{100 * aurc:.2f}" in test_table
    preset = load_specs(find_spec("fashion-mnist"))[0]
    assert preset.metrics[-4:] == ("adaptive_ece", "classwise_ece", "aurc", "augrc")


@pytest.mark.parametrize("preset", ["quick", "fashion-mnist", "cifar10-cpu", "cifar10"])
def test_every_bench_preset_parses(preset):
    specs = load_specs(find_spec(preset))
    assert specs and all(s.methods for s in specs)


def test_the_uci_preset_names_every_set_and_method():
    from peg.apps.bench.uci import METHODS
    from peg.data.uci import UCI_SETS

    options = load_uci_spec(find_spec("uci"))
    assert options is not None
    assert options["sets"] == list(UCI_SETS) and options["methods"] == list(METHODS)
    assert load_uci_spec(find_spec("quick")) is None


def test_the_quick_preset_holds_two_moons_and_digits():
    assert [s.data for s in load_specs(find_spec("quick"))] == ["two-moons", "digits"]


def test_unknown_preset_lists_the_presets():
    with pytest.raises(FileNotFoundError, match="quick"):
        find_spec("no-such-preset")


def test_invalid_yaml_is_a_spec_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: [unclosed")
    with pytest.raises(SpecError, match="not valid YAML"):
        load_specs(path)


def test_cli_runs_a_spec_file(tmp_path, capsys):
    spec = {**SMALL, "name": "cli-digits", "methods": ["Single"], "shift": {}, "ood": []}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    out = tmp_path / "out"
    assert main(["bench", str(path), "--out", str(out), "--cache", str(tmp_path / "c"),
                 "--no-progress", "--seeds", "1"]) == 0  # fmt: skip
    saved = json.loads((out / "cli-digits" / "results.json").read_text())
    assert saved["seeds"] == [1] and saved["command"].startswith("peg bench")
    assert "| Error % |" in capsys.readouterr().out


def test_fit_images_pads_mnist_for_cifar_and_resizes_otherwise():
    X = torch.rand(3, 1, 28, 28)
    padded = fit_images(X, (3, 32, 32), "mnist")
    assert padded.shape == (3, 3, 32, 32)
    torch.testing.assert_close(padded[:, 0, 2:30, 2:30], X[:, 0])
    assert fit_images(X, (1, 8, 8), "mnist").shape == (3, 1, 8, 8)
    with pytest.raises(ValueError, match="channels"):
        fit_images(torch.rand(2, 3, 28, 28), (1, 8, 8), "rgb")


def test_uci_runner_on_one_split_and_its_cache(tmp_path, monkeypatch):
    from peg.apps.bench import uci

    kwargs = {
        "sets": ["yacht"],
        "splits": 1,
        "epochs": 3,
        "methods": ["Single", "PEG-10", "EMP"],
        "out": tmp_path,
        "cache": tmp_path / "cache",
        "progress": False,
        "say": lambda _: None,
    }
    first = uci.run_uci(**kwargs)
    cells = first["datasets"]["yacht"]
    assert set(cells) == {"Single", "PEG-10", "EMP"}
    assert all(set(c) == {"rmse", "lpd"} and c["rmse"]["n"] == 1 for c in cells.values())
    assert (tmp_path / "uci" / "results.md").read_text().count("| yacht | 1 |") == 2

    def refuse(self, method):
        raise AssertionError("a cached method was rebuilt")

    monkeypatch.setattr(uci.Split, "build", refuse)
    assert uci.run_uci(**kwargs)["datasets"] == first["datasets"]
    with pytest.raises(ValueError, match="sets"):
        uci.run_uci(**{**kwargs, "sets": ["iris"]})


def test_packed_and_patched_methods_train_their_own_models(tmp_path):
    spec = parse_spec(
        {
            **SMALL,
            "name": "tiny-own",
            "model": {"name": "mlp", "hidden": [16]},
            "train": {"epochs": 8, "lr": 0.1, "batch_size": 64},
            "methods": ["Packed-(2,2,1)", {"name": "EMP", "n_members": 3}, "ECMP"],
            "shift": {},
            "ood": [],
        }
    )
    assert [m.method for m in spec.methods] == ["packed", "emp", "ecmp"]
    assert spec.methods[0].options == {"alpha": 2.0, "num_estimators": 2, "gamma": 1}
    results = run_bench(spec, tmp_path)
    test = results["datasets"]["test"]
    assert test["Packed-(2,2,1)"]["error"]["mean"] < 0.3
    assert set(test) == {"Packed-(2,2,1)", "EMP", "ECMP"}
    with pytest.raises(ValueError, match="num_estimators"):
        check_methods(parse_spec({**SMALL, "methods": ["Packed-(2,0,1)"]}))
    with pytest.raises(ValueError, match="unknown option"):
        check_methods(parse_spec({**SMALL, "methods": [{"name": "EMP", "colour": 1}]}))


def test_uci_summary_keeps_an_infinite_split_visible():
    from peg.apps.bench.uci import _report, _se

    assert _se([1.0, 2.0, 3.0])["se"] == pytest.approx(1 / 3**0.5)
    bad = _se([-2.0, -math.inf, -3.0])
    assert bad == {"mean": None, "std": None, "se": None, "n": 3, "nonfinite": 1}
    results = {
        "command": "c",
        "commit": "x",
        "machine": "m",
        "wall_seconds": 1.0,
        "datasets": {
            "protein": {
                "A": {"rmse": _se([1.0, 2.0]), "lpd": _se([-2.0, -math.inf])},
                "B": {"rmse": _se([1.5, 2.5]), "lpd": _se([-3.0, -3.5])},
            }
        },
    }
    text = _report(results, ["A", "B"])
    assert "−∞ (1 of 2 splits)" in text and "**-3.250 ± 0.250**" in text


def test_laplace_columns_by_name(tmp_path):
    pytest.importorskip("laplace")
    spec = parse_spec(
        {
            **SMALL,
            "name": "tiny-laplace",
            "model": {"name": "mlp", "hidden": [16]},
            "train": {"epochs": 2, "lr": 0.1, "batch_size": 64},
            "methods": ["Single", "Laplace", "Laplace-MC-3"],
            "shift": {},
            "ood": [],
        }
    )
    assert [(m.method, m.base) for m in spec.methods][1:] == [("laplace", "single")] * 2
    check_methods(spec)
    results = run_bench(spec, tmp_path)
    test = results["datasets"]["test"]
    assert set(test) == {"Single", "Laplace", "Laplace-MC-3"}
    assert test["Laplace"]["error"]["mean"] < 0.5
    with pytest.raises(ValueError, match="link_approx"):
        check_methods(parse_spec({**SMALL, "methods": [{"name": "Laplace", "link_approx": "x"}]}))
