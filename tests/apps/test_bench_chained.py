"""`peg bench` columns fitted on an earlier column ("PEG-S + TS", "TS → PEG-S", `base:` naming a
column; one mechanism with `peg.compare`, `peg.apps.chain`), the PEG variants by name, early
stopping of the bases (`train: {patience: P}`), and the costs table."""

from __future__ import annotations

import json

import pytest
import torch

from peg.apps import chain
from peg.apps.bench import runner
from peg.apps.bench.runner import work_units
from peg.apps.bench.seed import SeedRun
from peg.apps.bench.spec import SpecError, find_spec, load_specs, parse_spec
from peg.apps.compare import methods as compare_methods
from peg.methods import PEG, TemperatureScaling

from conftest import run_bench

SPEC = {
    "name": "tiny-chained",
    "data": "digits",
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"epochs": 40, "lr": 0.01, "optimizer": "adam", "weight_decay": 0.0,
              "schedule": "constant", "batch_size": 64, "patience": 2},
    "seeds": [0],
    "train_points": 300,
    "score_points": None,
    "methods": ["Single", "Temp-scaled", "PEG-4", "PEG-4 (ascent)", "PEG-4 (last layer)",
                "PEG-4 + TS", "TS → PEG-4",
                {"name": "TS on PEG-4 (ascent)", "method": "temperature",
                 "base": "PEG-4 (ascent)"}],
    "shift": {"rotations": [30]},
}  # fmt: skip



@pytest.fixture(scope="module")
def chained_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("chained")
    spec = parse_spec(SPEC)
    results = run_bench(spec, out)
    return out, spec, results


def test_the_variants_by_name_mean_what_they_say():
    by_name = {m.name: m for m in parse_spec(SPEC).methods}
    assert by_name["PEG-4 (ascent)"].options == {"n_members": 4, "direction": "ascent"}
    assert by_name["PEG-4 (last layer)"].options == {"n_members": 4, "params": "last_layer"}
    assert (by_name["PEG-4 + TS"].method, by_name["PEG-4 + TS"].base) == ("temperature", "PEG-4")
    ts_peg = by_name["TS → PEG-4"]
    assert (ts_peg.method, ts_peg.base, ts_peg.options) == ("peg", "Temp-scaled", {"n_members": 4})
    ascii_arrow = parse_spec({**SPEC, "methods": ["Single", "Temp-scaled", "TS -> PEG-4"]})
    assert ascii_arrow.methods[2].base == "Temp-scaled"


@pytest.mark.parametrize(
    ("methods", "match"),
    [
        (["Single", "PEG-4 + TS"], r"methods\[1\]: 'PEG-4 \+ TS' is fitted on the column 'PEG-4'"),
        (["TS → PEG-4", "Temp-scaled"], r"methods\[0\]: .* list 'Temp-scaled' before it"),
        ([{"name": "x", "method": "temperature", "base": "Later"}, "Later"], r"methods\[0\]\.base"),
    ],
)
def test_a_base_column_must_come_earlier(methods, match):
    with pytest.raises(SpecError, match=match):
        parse_spec({**SPEC, "methods": methods})


def test_swa_runs_do_not_stop_early():
    swa = {"epochs": 4, "schedule": "swa", "swa_start": 2, "swa_lr": 0.01, "patience": 2}
    with pytest.raises(SpecError, match=r"swa\.patience"):
        parse_spec({**SPEC, "swa": swa, "methods": ["SWA"]})


def test_chained_columns_are_fitted_on_the_earlier_columns_predictor(chained_run):
    out, spec, _ = chained_run
    run = SeedRun(spec, 0, out / "cache", progress=False)
    by_name = {m.name: m for m in spec.methods}
    peg_ts = run.build(by_name["PEG-4 + TS"])
    assert isinstance(peg_ts, TemperatureScaling) and isinstance(peg_ts.predictor_, PEG)
    ts_peg = run.build(by_name["TS → PEG-4"])
    assert isinstance(ts_peg, PEG) and isinstance(ts_peg.ensemble_.skeleton, chain.Scaled)
    temperature = run.fitted["Temp-scaled"].temperature_
    assert ts_peg.ensemble_.skeleton.temperature == temperature
    # the same predictors as cached: the logits a rebuild gives are the cached ones
    X = run.test[0]
    assert torch.allclose(peg_ts.member_logits(X), run.logits(by_name["PEG-4 + TS"])["test"])
    # compare uses the same mechanism
    assert compare_methods.Scaled is chain.Scaled and compare_methods.as_base is chain.as_base


def test_results_hold_costs_and_how_the_bases_trained(chained_run):
    out, spec, _ = chained_run
    saved = json.loads((out / "tiny-chained" / "results.json").read_text())
    assert list(saved["datasets"]["test"]) == [m.name for m in spec.methods]
    costs = saved["costs"]
    assert costs["PEG-4"]["forwards"] == [4.0] and costs["Single"]["forwards"] == [1.0]
    assert costs["PEG-4 + TS"]["forwards"] == [4.0] == costs["TS → PEG-4"]["forwards"]
    assert costs["PEG-4"]["eta"][0] > 0 and costs["Temp-scaled"]["T"][0] > 0
    # a chained column's fit counts its base column's
    assert costs["PEG-4 + TS"]["seconds"][0] >= costs["PEG-4"]["seconds"][0]
    assert costs["TS → PEG-4"]["seconds"][0] >= costs["Temp-scaled"]["seconds"][0]
    assert all(c["predict_seconds"][0] > 0 for c in costs.values())
    trained = saved["base_training"]["seed-0"]
    assert trained["epochs"][0] < spec.train.epochs  # stopped early on the validation loss
    assert trained["best_epoch"][0] == trained["epochs"][0] - spec.train.patience
    text = (out / "tiny-chained" / "results.md").read_text()
    assert (
        "## costs" in text
        and "| Forwards |" in text
        and "Base training (deep-ensemble members), seed-0" in text
    )


def test_a_rerun_rebuilds_nothing(chained_run, monkeypatch):
    out, spec, reference = chained_run

    def refuse(self, method):
        raise AssertionError("a cached method was rebuilt")

    monkeypatch.setattr(runner.SeedRun, "build", refuse)
    again = run_bench(spec, out)
    assert again["datasets"] == reference["datasets"]


def test_chained_columns_share_their_bases_work_unit():
    units = work_units(parse_spec(SPEC))
    assert len(units) == 1 and len(units[0][1]) == len(SPEC["methods"])


@pytest.mark.parametrize("preset", ["digits-adam", "fashion-mnist-adam", "cifar10-adam"])
def test_the_over_confident_presets_parse(preset):
    (spec,) = load_specs(find_spec(preset))
    names = [m.name for m in spec.methods]
    assert {"PEG-15 + TS", "TS → PEG-15", "PEG-15 (ascent)", "PEG-15 (last layer)"} <= set(names)
    assert spec.train.optimizer == "adam" and spec.train.weight_decay == 0.0
    runner.check_methods(spec)
